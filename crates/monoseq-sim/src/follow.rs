//! The followers of the simulated cluster (invariant 15): clients that read a partition's
//! PLog page by page from the last offset they saw, through any node. A node that holds the
//! partition reads it below its own end (what its writer acknowledged), with the ranges of
//! the accepted losses it knows as gaps; any other node relays the read to the owner its
//! lease table names, as the server's `consume.rs` does. Answers are lost or come late;
//! nodes die, pause and move partitions; the database fails over and loses tails: a follower
//! just asks again from its last offset.
//!
//! Checked at every page: offsets contiguous from 1, nothing repeated, each gap where the
//! follower stands, no event other than the one acknowledged at its offset. At the end (after
//! a last catch-up at each owner): every acknowledged event delivered, and every event seen
//! is the one the final PLog holds at its offset, or lies in a range an accepted loss retired.
//!
//! Followers draw their choices from a random source of their own, and read the database
//! without its fault dice: a seed's commands and faults are the same with or without them.

use std::collections::BTreeMap;

use monoseq_membership::Route;
use monoseq_store::{AcceptedLoss, Gap, PLOG_PAGE_ITEMS_MAX, PageItem, retired_ranges};
use rand::RngExt;

use crate::{CLIENT_TIMEOUT_MS, Kind, Sim, Violation};

/// Most followers a seed runs.
pub const FOLLOWERS_MAX: usize = 3;
/// Per mille of page reads whose storage call fails.
const READ_FAIL_PER_MILLE: u32 = 10;
/// Per mille of page answers lost on the way back.
const ANSWER_LOST_PER_MILLE: u32 = 20;
/// The latest a page answer comes, milliseconds.
const ANSWER_LATE_MS_MAX: u64 = 100;
/// Longest a follower waits before it asks again after an empty page or an error.
const IDLE_MS_MAX: u64 = 200;
/// Pages the last catch-up reads at most per follower.
const CATCH_UP_PAGES_MAX: usize = 100;

/// What a follower saw at an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The event with this idempotency key.
    Event(String),
    /// A retired range from here up to this offset.
    Gap(u64),
}

/// A follower of one partition.
pub(crate) struct Follower {
    pub(crate) partition: u32,
    /// The next offset it asks for (one past the last it saw).
    pub(crate) next: u64,
    limit: usize,
    /// Everything it saw, by offset.
    pub(crate) seen: BTreeMap<u64, Seen>,
    /// The offset at which it saw each key.
    keys: BTreeMap<String, u64>,
    /// Its outstanding request: number and when it was sent.
    asked: Option<(u64, u64)>,
    requests: u64,
    next_ask: u64,
}

/// An item of a page as it travels: an event by offset and key, or a gap.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Event(u64, String),
    Gap(u64, u64),
}

/// A page answer on its way back to a follower.
pub(crate) struct InFlight {
    at: u64,
    follower: usize,
    request: u64,
    answer: Result<Vec<Item>, NoPage>,
}

/// Why a page read got no page (the follower asks again later).
#[derive(Debug)]
pub(crate) enum NoPage {
    /// The node's read of the database failed.
    DatabaseSilent,
    /// The node cannot place the read (as the server's 503 `partition_unavailable`).
    Unplaced,
    /// Relaying the read to the owner failed.
    OwnerSilent,
    /// The store refused the read.
    Read,
}

fn item(page: PageItem) -> Item {
    match page {
        PageItem::Event(e) => Item::Event(
            e.plog_offset.0,
            e.idempotency.map(|i| i.key).unwrap_or_default(),
        ),
        PageItem::Gap(Gap { from, to, .. }) => Item::Gap(from, to),
    }
}

impl Follower {
    pub(crate) fn new(partition: u32, limit: usize, start: u64) -> Follower {
        Follower {
            partition,
            next: 1,
            limit,
            seen: BTreeMap::new(),
            keys: BTreeMap::new(),
            asked: None,
            requests: 0,
            next_ask: start,
        }
    }
}

impl Sim {
    /// One tick of the followers: answers arrive, followers due ask again.
    pub(crate) fn tick_followers(&mut self) {
        let now = self.now;
        let (due, later): (Vec<InFlight>, Vec<InFlight>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|a| a.at <= now);
        self.in_flight = later;
        for a in due {
            let f = &mut self.followers[a.follower];
            if f.asked.map(|(id, _)| id) != Some(a.request) {
                // An answer to a request it gave up on: it asked again since.
                continue;
            }
            f.asked = None;
            match a.answer {
                Ok(items) => {
                    let empty = items.is_empty();
                    self.take_page(a.follower, items);
                    let wait = if empty {
                        self.readers_rng.random_range(10..=IDLE_MS_MAX)
                    } else {
                        self.readers_rng.random_range(0..=30)
                    };
                    self.followers[a.follower].next_ask = now + wait;
                }
                Err(_) => {
                    let wait = self.readers_rng.random_range(20..=IDLE_MS_MAX);
                    self.followers[a.follower].next_ask = now + wait;
                }
            }
        }
        for i in 0..self.followers.len() {
            let f = &self.followers[i];
            let due = match f.asked {
                Some((_, at)) => now >= at + CLIENT_TIMEOUT_MS,
                None => now >= f.next_ask,
            };
            if due {
                self.ask(i);
            }
        }
    }

    /// Follower `i` asks a node picked at random for its next page.
    fn ask(&mut self, i: usize) {
        let f = &mut self.followers[i];
        f.requests += 1;
        f.asked = Some((f.requests, self.now));
        let (request, p, from, limit) = (f.requests, f.partition, f.next, f.limit);
        let to = self.readers_rng.random_range(0..self.nodes.len());
        let Some(answer) = self.read_at(to, p, from, limit, true) else {
            return;
        };
        if self.readers_rng.random_range(0..1_000u32) < ANSWER_LOST_PER_MILLE {
            return;
        }
        let at = self.now + self.readers_rng.random_range(0..=ANSWER_LATE_MS_MAX);
        self.in_flight.push(InFlight {
            at,
            follower: i,
            request,
            answer,
        });
    }

    /// A page of `p` from `from` asked of node `to`: read there when it holds `p`, else
    /// relayed to the owner its lease table names (once: the owner reads it or refuses).
    /// `None` when no answer comes (the node is down or paused).
    pub(crate) fn read_at(
        &mut self,
        to: usize,
        p: u32,
        from: u64,
        limit: usize,
        may_relay: bool,
    ) -> Option<Result<Vec<Item>, NoPage>> {
        let node = &self.nodes[to];
        if !node.alive || self.now < node.paused_until {
            return None;
        }
        let owner = match node.route(p, self.now, node.holds(p), !may_relay) {
            Route::Local => {
                if !self.db.reachable(&node.name)
                    || self.readers_rng.random_range(0..1_000u32) < READ_FAIL_PER_MILLE
                {
                    return Some(Err(NoPage::DatabaseSilent));
                }
                let page = node.read_page(&self.db, p, from, limit)?;
                return Some(
                    page.map(|items| items.into_iter().map(item).collect())
                        .map_err(|_| NoPage::Read),
                );
            }
            Route::Unavailable(_) => return Some(Err(NoPage::Unplaced)),
            Route::Relay(owner) => owner,
        };
        match self.relay_target(to, &owner.node_id) {
            Some(target) => self.read_at(target, p, from, limit, false),
            None => Some(Err(NoPage::OwnerSilent)),
        }
    }

    /// Follower `i` takes a page: each item must start where it stands, and an event must be
    /// the one acknowledged at its offset, if any, and new to it.
    fn take_page(&mut self, i: usize, items: Vec<Item>) {
        let mut broken = Vec::new();
        let went_back = self.db.went_back() > 0;
        let f = &mut self.followers[i];
        let p = f.partition;
        for it in items {
            match it {
                Item::Event(offset, key) => {
                    if offset != f.next {
                        broken.push(format!(
                            "a follower of partition {p} at offset {} was given the event at \
                             offset {offset} ({key})",
                            f.next
                        ));
                        break;
                    }
                    if let Some(acked) = self.plog.get(&(p, offset))
                        && *acked != key
                    {
                        broken.push(format!(
                            "a follower of partition {p} saw {key} at offset {offset}, which \
                             was acknowledged to {acked}"
                        ));
                    }
                    if let Some(before) = f.keys.insert(key.clone(), offset)
                        && !went_back
                    {
                        broken.push(format!(
                            "a follower of partition {p} saw {key} twice: at offsets {before} \
                             and {offset}"
                        ));
                    }
                    f.seen.insert(offset, Seen::Event(key));
                    f.next = offset + 1;
                }
                Item::Gap(from, to) => {
                    if from != f.next || to < from {
                        broken.push(format!(
                            "a follower of partition {p} at offset {} was given a gap \
                             {from}..={to}",
                            f.next
                        ));
                        break;
                    }
                    f.seen.insert(from, Seen::Gap(to));
                    f.next = to + 1;
                }
            }
        }
        for b in broken {
            self.pending_violation(Kind::Reader, b);
        }
    }

    /// An acknowledgment of `key` at `offset` of `p`: no follower saw another event there.
    pub(crate) fn check_followers_saw(&mut self, p: u32, offset: u64, key: &str) {
        let broken: Vec<String> = self
            .followers
            .iter()
            .filter(|f| f.partition == p)
            .filter_map(|f| match f.seen.get(&offset) {
                Some(Seen::Event(k)) if k != key => Some(format!(
                    "a follower of partition {p} saw {k} at offset {offset}, which was then \
                     acknowledged to {key}"
                )),
                _ => None,
            })
            .collect();
        for b in broken {
            self.pending_violation(Kind::Reader, b);
        }
    }

    /// After the run, each follower reads up to its partition's end at the owner (no faults).
    pub(crate) fn catch_up_followers(&mut self) -> Result<(), Violation> {
        for i in 0..self.followers.len() {
            let p = self.followers[i].partition;
            let owner = (0..self.nodes.len())
                .find(|&n| self.nodes[n].is_member() && self.nodes[n].serves_ready(p))
                .ok_or_else(|| {
                    Kind::Liveness.of(format!("no node serves partition {p} at the end"))
                })?;
            for _ in 0..CATCH_UP_PAGES_MAX {
                let from = self.followers[i].next;
                let page = self.nodes[owner]
                    .read_page(&self.db, p, from, PLOG_PAGE_ITEMS_MAX)
                    .ok_or_else(|| {
                        Kind::Safety.of(format!("the owner of partition {p} does not hold it"))
                    })?
                    .map_err(|e| Kind::Read.of(format!("reading partition {p} at the end: {e}")))?;
                if page.is_empty() {
                    break;
                }
                self.take_page(i, page.into_iter().map(item).collect());
            }
            let end = self.nodes[owner].plog_end(p).unwrap_or(0);
            let next = self.followers[i].next;
            if next < end {
                return Err(Kind::Reader.of(format!(
                    "a follower of partition {p} stopped at offset {next}, below the owner's \
                     end {end}"
                )));
            }
        }
        self.check_now()
    }

    /// At the end: every acknowledged event was delivered to each follower of its partition,
    /// and every event a follower saw is the one `events` (the final PLog: (partition,
    /// offset) to key) holds there, or lies in a range retired by one of `losses`; every gap
    /// it saw is retired and holds no event.
    pub(crate) fn check_followers_end(
        &self,
        events: &BTreeMap<(u32, u64), String>,
        losses: &[AcceptedLoss],
    ) -> Result<(), Violation> {
        for f in &self.followers {
            let p = f.partition;
            let retired = retired_ranges(losses, p);
            let is_retired = |o: u64| retired.iter().any(|g| g.from <= o && o <= g.to);
            for ((_, offset), key) in self.plog.range((p, 0)..(p + 1, 0)) {
                let delivered = match f.seen.range(..=*offset).next_back() {
                    Some((at, Seen::Event(k))) => at == offset && k == key,
                    Some((_, Seen::Gap(to))) => offset <= to && is_retired(*offset),
                    None => false,
                };
                if !delivered {
                    return Err(Kind::Reader.of(format!(
                        "PLog offset {offset} of partition {p}, acknowledged to {key}, was not \
                         delivered to a follower (it stopped at offset {})",
                        f.next
                    )));
                }
            }
            for (offset, seen) in &f.seen {
                match seen {
                    Seen::Event(key) => match events.get(&(p, *offset)) {
                        Some(k) if k == key => {}
                        None if is_retired(*offset) => {}
                        Some(k) => {
                            return Err(Kind::Reader.of(format!(
                                "a follower of partition {p} saw {key} at offset {offset}, \
                                 where the PLog holds {k} in the end"
                            )));
                        }
                        None => {
                            return Err(Kind::Reader.of(format!(
                                "a follower of partition {p} saw {key} at offset {offset}, \
                                 which the PLog does not hold in the end and no accepted loss \
                                 retired"
                            )));
                        }
                    },
                    Seen::Gap(to) => {
                        if let Some(o) = (*offset..=*to).find(|o| !is_retired(*o)) {
                            return Err(Kind::Reader.of(format!(
                                "a follower of partition {p} was given a gap over offset {o}, \
                                 which no accepted loss retired"
                            )));
                        }
                        if let Some(((_, o), k)) = events.range((p, *offset)..=(p, *to)).next() {
                            return Err(Kind::Reader.of(format!(
                                "a follower of partition {p} was given a gap over offset {o}, \
                                 where the PLog holds {k}"
                            )));
                        }
                    }
                }
            }
            if let Some(((_, last), _)) = events.range((p, 0)..(p + 1, 0)).next_back()
                && f.next <= *last
            {
                return Err(Kind::Reader.of(format!(
                    "a follower of partition {p} stopped at offset {}, below the PLog's last \
                     event {last}",
                    f.next
                )));
            }
        }
        Ok(())
    }
}
