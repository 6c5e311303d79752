//! Numbers by workspace in one open-addressed array: a workspace's key and numbers share one
//! cache line, so a lookup in a table far larger than the CPU cache misses it once, where a
//! map with separate control bytes misses twice. Entries are never removed, which keeps linear
//! probing simple: a probe ends at the first empty slot.

use crate::types::{Number, SeqId, WsId};
use crate::ws_numbers::WsNumbers;

/// One workspace per cache line.
#[derive(Debug, Clone, Default)]
#[repr(align(64))]
struct Slot {
    ws: WsId,
    /// Empty when the slot is free: a stored workspace has at least one number.
    numbers: WsNumbers,
}

/// Numbers by workspace; never more than half full.
#[derive(Debug, Clone, Default)]
pub(crate) struct WsTable {
    slots: Vec<Slot>,
    len: usize,
}

impl WsTable {
    /// Room for `workspaces` workspaces without growing.
    pub(crate) fn reserve(&mut self, workspaces: usize) {
        let want = workspaces.saturating_mul(2).next_power_of_two().max(16);
        if want > self.slots.len() {
            self.grow_to(want);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn home(&self, ws: WsId) -> usize {
        // Fibonacci hashing: the top bits of the product spread sequential IDs evenly.
        let bits = self.slots.len().trailing_zeros();
        (ws.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// The slot of `ws`, or the empty slot where it would go.
    fn find(&self, ws: WsId) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(ws);
        loop {
            let s = &self.slots[i];
            if s.numbers.is_empty() || s.ws == ws {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    pub(crate) fn get(&self, ws: WsId) -> Option<&WsNumbers> {
        if self.slots.is_empty() {
            return None;
        }
        let s = &self.slots[self.find(ws)];
        (!s.numbers.is_empty()).then_some(&s.numbers)
    }

    /// Sets numbers of `ws` (none given: nothing changes).
    pub(crate) fn set_all(&mut self, ws: WsId, numbers: impl IntoIterator<Item = (SeqId, Number)>) {
        let mut numbers = numbers.into_iter().peekable();
        if numbers.peek().is_none() {
            return;
        }
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow_to((self.slots.len() * 2).max(16));
        }
        let i = self.find(ws);
        let s = &mut self.slots[i];
        if s.numbers.is_empty() {
            s.ws = ws;
            self.len += 1;
        }
        for (seq, n) in numbers {
            s.numbers.set(seq, n);
        }
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (WsId, &WsNumbers)> {
        self.slots
            .iter()
            .filter(|s| !s.numbers.is_empty())
            .map(|s| (s.ws, &s.numbers))
    }

    fn grow_to(&mut self, slots: usize) {
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); slots]);
        for s in old {
            if !s.numbers.is_empty() {
                let i = self.find(s.ws);
                self.slots[i] = s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers_of(t: &WsTable, ws: u64) -> Option<Vec<(SeqId, Number)>> {
        t.get(WsId(ws)).map(|n| n.iter().collect())
    }

    #[test]
    fn every_workspace_is_found_after_the_table_grows() {
        let mut t = WsTable::default();
        // Sequential IDs, IDs spaced by a power of two (the worst case for a mask of the
        // low bits), and the extremes.
        let ids: Vec<u64> = (0..5_000)
            .chain((1..3_000).map(|i| i << 20))
            .chain([u64::MAX, u64::MAX - 1])
            .collect();
        for &ws in &ids {
            t.set_all(WsId(ws), [(SeqId(1), Number(ws ^ 7))]);
        }
        assert_eq!(t.len(), ids.len());
        for &ws in &ids {
            assert_eq!(numbers_of(&t, ws), Some(vec![(SeqId(1), Number(ws ^ 7))]));
        }
        assert_eq!(numbers_of(&t, 5_001), None);
        assert_eq!(t.iter().count(), ids.len());
    }

    #[test]
    fn a_workspace_set_again_keeps_one_slot_and_its_other_numbers() {
        let mut t = WsTable::default();
        t.reserve(4);
        t.set_all(WsId(3), [(SeqId(1), Number(1)), (SeqId(2), Number(2))]);
        t.set_all(WsId(3), [(SeqId(2), Number(9))]);
        t.set_all(WsId(4), []);
        assert_eq!(t.len(), 1);
        assert_eq!(
            numbers_of(&t, 3),
            Some(vec![(SeqId(1), Number(1)), (SeqId(2), Number(9))])
        );
        assert_eq!(numbers_of(&t, 4), None);
    }

    #[test]
    fn a_table_stays_at_most_half_full() {
        let mut t = WsTable::default();
        t.reserve(1_000);
        let slots = t.slots.len();
        for ws in 0..1_000 {
            t.set_all(WsId(ws), [(SeqId(1), Number(1))]);
        }
        assert_eq!(t.slots.len(), slots, "reserved room must not grow");
        assert!(t.len() * 2 <= t.slots.len());
    }

    #[test]
    fn a_slot_is_one_cache_line() {
        assert_eq!(size_of::<Slot>(), 64);
    }
}
