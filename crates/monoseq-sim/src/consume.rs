//! The consumers of the simulated cluster (invariant 17): named consumers, two instances of
//! each racing on one partition, that read their stored position through any node, read the
//! next page of the partition after it (as followers do, see `crate::follow`), and store the
//! page's last offset with a compare-and-set on the value they read, through any node; now
//! and then one rewinds with `force`. Calls fail, lose their request or their answer; a
//! write whose answer was lost is resolved by reading the position back.
//!
//! Checked at every answer: a position read is never below the last one known stored
//! (written or read) unless a forced write came between, or the database went back; two
//! writes on the same expected value never both succeed (unless a forced write or a database
//! going back brought the value back between them).

use std::collections::BTreeSet;
use std::sync::Arc;

use monoseq_store::{
    AppId, ConsumerName, EventStore, PartitionId, PositionError, SetPosition, TrustLevel,
};
use rand::RngExt;

use crate::db::{ClientFate, ClientKv};
use crate::follow::Item;
use crate::{Kind, Sim};

/// Most consumer names a seed runs (each with two instances).
pub const CONSUMERS_MAX: usize = 2;
/// Instances of one consumer name, racing on its partition.
const INSTANCES: usize = 2;
/// Per mille of position calls that fail cleanly.
const CALL_FAIL_PER_MILLE: u32 = 10;
/// Per mille of position writes whose request is lost.
const REQUEST_LOST_PER_MILLE: u32 = 10;
/// Per mille of position writes applied whose answer is lost.
const ANSWER_LOST_PER_MILLE: u32 = 20;
/// One write in this many rewinds the position, forced.
const FORCED_ONE_IN: u32 = 40;
/// Longest pause between two steps of a consumer instance, milliseconds.
const TURN_MS_MAX: u64 = 100;
/// Most events a consumer instance takes in one page.
const PAGE_ITEMS: usize = 32;

/// One instance of a consumer.
pub(crate) struct Consumer {
    /// Index of its name among the seed's consumer names.
    group: usize,
    name: ConsumerName,
    partition: u32,
    /// What it last read of its position (`Some(None)`: none stored); `None` when it must
    /// read it.
    read: Option<Option<u64>>,
    /// A write whose answer was lost (offset, forced), to resolve by reading back.
    unresolved: Option<(u64, bool)>,
    next_turn: u64,
}

/// What the checks know of one consumer name's position.
#[derive(Default)]
pub(crate) struct Known {
    /// The last position known stored, and how often the database had gone back then;
    /// `None` after a forced write whose outcome is unknown.
    floor: Option<(Option<u64>, u64)>,
    /// The expected values of the unforced writes that succeeded, each with how often the
    /// database had gone back then, since the last forced write.
    won: BTreeSet<(u64, Option<u64>)>,
}

/// The consumer instances of a seed and what the checks know of their names.
pub(crate) fn consumers(
    rng: &mut rand_chacha::ChaCha8Rng,
    partitions: u32,
) -> (Vec<Consumer>, Vec<Known>) {
    let names = rng.random_range(1..=CONSUMERS_MAX);
    let mut all = Vec::new();
    for group in 0..names {
        let partition = rng.random_range(0..partitions);
        let name = ConsumerName::new(&format!("projector-{group}"))
            .expect("the simulation's consumer names are valid");
        for _ in 0..INSTANCES {
            all.push(Consumer {
                group,
                name: name.clone(),
                partition,
                read: None,
                unresolved: None,
                next_turn: rng.random_range(0..2_000),
            });
        }
    }
    (all, (0..names).map(|_| Known::default()).collect())
}

impl Sim {
    /// One tick of the consumers: each instance due takes one step.
    pub(crate) fn tick_consumers(&mut self) {
        for i in 0..self.consumers.len() {
            if self.now >= self.consumers[i].next_turn {
                self.consumer_turn(i);
                let wait = self.readers_rng.random_range(0..=TURN_MS_MAX);
                self.consumers[i].next_turn = self.now + wait;
            }
        }
    }

    /// The store as a node picked at random reaches it for one call, with the call's fate;
    /// `None` when the node does not answer.
    fn position_store(&mut self, write: bool) -> Option<EventStore<ClientKv>> {
        let to = self.readers_rng.random_range(0..self.nodes.len());
        let node = &self.nodes[to];
        if !node.alive || self.now < node.paused_until {
            return None;
        }
        let roll = self.readers_rng.random_range(0..1_000u32);
        let fate = match roll {
            r if r < CALL_FAIL_PER_MILLE => ClientFate::Fail,
            r if write && r < CALL_FAIL_PER_MILLE + REQUEST_LOST_PER_MILLE => {
                ClientFate::LoseRequest
            }
            r if write
                && r < CALL_FAIL_PER_MILLE + REQUEST_LOST_PER_MILLE + ANSWER_LOST_PER_MILLE =>
            {
                ClientFate::LoseAnswer
            }
            _ => ClientFate::Normal,
        };
        let kv = ClientKv {
            db: Arc::clone(&self.db),
            node: node.name.clone(),
            fate,
        };
        Some(EventStore::new(kv, AppId(1), TrustLevel::Level0))
    }

    /// One step of consumer instance `i`: read its position when it does not know it (or a
    /// write's answer was lost), else take the next page and store its last offset.
    fn consumer_turn(&mut self, i: usize) {
        let c = &self.consumers[i];
        let (name, p) = (c.name.clone(), c.partition);
        let Some(read) = c.read.filter(|_| c.unresolved.is_none()) else {
            let Some(store) = self.position_store(false) else {
                return;
            };
            if let Ok(value) = store.position(&name, PartitionId(p)) {
                self.position_read(i, value);
                let c = &mut self.consumers[i];
                if let Some((offset, _)) = c.unresolved.take()
                    && value == Some(offset)
                {
                    self.report.positions_read_back += 1;
                }
            }
            return;
        };
        let from = read.unwrap_or(0) + 1;
        let to = self.readers_rng.random_range(0..self.nodes.len());
        let Some(Ok(items)) = self.read_at(to, p, from, PAGE_ITEMS, true) else {
            return;
        };
        let Some(last) = items.last() else {
            return;
        };
        let processed = match last {
            Item::Event(offset, _) => *offset,
            Item::Gap(_, to) => *to,
        };
        let force = self.readers_rng.random_range(0..FORCED_ONE_IN) == 0;
        let offset = if force {
            read.unwrap_or(0) / 2
        } else {
            processed
        };
        let set = SetPosition {
            offset,
            expected: read,
            force,
        };
        let Some(store) = self.position_store(true) else {
            return;
        };
        match store.set_position(&name, PartitionId(p), set) {
            Ok(()) => self.position_written(i, set),
            Err(PositionError::Conflict { current, .. }) => {
                self.report.position_conflicts += 1;
                self.position_read(i, current);
            }
            Err(PositionError::Storage(monoseq_kv::KvError::OutcomeUnknown { .. })) => {
                let c = &mut self.consumers[i];
                c.unresolved = Some((offset, force));
                c.read = None;
                if force {
                    // It may have moved back: nothing is known of it until read.
                    self.known[c.group] = Known::default();
                }
            }
            Err(PositionError::Storage(_)) => {}
            Err(e) => self.pending_violation(
                Kind::Reader,
                format!("consumer {name} on partition {p}: storing {set:?} was refused: {e}"),
            ),
        }
    }

    /// Instance `i` read `value` of its position (a read, or a conflict's current value).
    fn position_read(&mut self, i: usize, value: Option<u64>) {
        let went_back = self.db.went_back();
        let c = &mut self.consumers[i];
        c.read = Some(value);
        let known = &mut self.known[c.group];
        if let Some((floor, at)) = known.floor
            && at == went_back
            && value < floor
        {
            let v = format!(
                "the position of consumer {} on partition {} went back from {floor:?} to \
                 {value:?} without a forced write",
                c.name, c.partition
            );
            self.pending_violation(Kind::Reader, v);
        }
        self.known[self.consumers[i].group].floor = Some((value, went_back));
    }

    /// Instance `i`'s write `set` succeeded.
    fn position_written(&mut self, i: usize, set: SetPosition) {
        let went_back = self.db.went_back();
        self.report.positions_set += 1;
        let c = &mut self.consumers[i];
        c.read = Some(Some(set.offset));
        let known = &mut self.known[c.group];
        if set.force {
            known.won.clear();
        } else if !known.won.insert((went_back, set.expected)) {
            let v = format!(
                "two writes of consumer {}'s position on partition {} expecting {:?} both \
                 succeeded",
                c.name, c.partition, set.expected
            );
            self.pending_violation(Kind::Reader, v);
        }
        self.known[self.consumers[i].group].floor = Some((Some(set.offset), went_back));
    }
}
