//! A workspace's numbers as one value: the few sequences of a workspace kind kept inline, so a
//! map keyed by workspace reads or updates all of them with one hash lookup and no allocation.
//! [`NumberMap`] is such a map; the backlog, pending transactions and replay use it.

use hashbrown::HashMap;

use crate::types::{Number, NumberKey, SeqId, SeqValue, WsId};

/// Sequences kept inline before spilling to the heap; the built-in kinds have three.
const INLINE_SEQS: usize = 4;

/// Numbers of one workspace, by sequence. Sequence IDs and numbers sit in separate arrays so
/// the inline part packs into 40 bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct WsNumbers {
    seqs: [SeqId; INLINE_SEQS],
    numbers: [Number; INLINE_SEQS],
    len: u8,
    /// Sequences past the inline ones; boxed so a workspace with none costs one pointer.
    #[allow(
        clippy::box_collection,
        reason = "one pointer instead of three keeps a workspace and its key in 64 bytes"
    )]
    spill: Option<Box<Vec<(SeqId, Number)>>>,
}

impl WsNumbers {
    fn spilled(&self) -> &[(SeqId, Number)] {
        self.spill.as_deref().map_or(&[], Vec::as_slice)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (SeqId, Number)> + '_ {
        let len = usize::from(self.len);
        self.seqs[..len]
            .iter()
            .copied()
            .zip(self.numbers[..len].iter().copied())
            .chain(self.spilled().iter().copied())
    }

    fn slot(&mut self, seq: SeqId) -> Option<&mut Number> {
        let len = usize::from(self.len);
        match self.seqs[..len].iter().position(|&s| s == seq) {
            Some(i) => Some(&mut self.numbers[i]),
            None => self
                .spill
                .as_deref_mut()?
                .iter_mut()
                .find(|(s, _)| *s == seq)
                .map(|(_, n)| n),
        }
    }

    /// How many sequences have a number.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len) + self.spilled().len()
    }

    /// The number of `seq`, if it has one.
    pub(crate) fn get(&self, seq: SeqId) -> Option<Number> {
        let len = usize::from(self.len);
        match self.seqs[..len].iter().position(|&s| s == seq) {
            Some(i) => Some(self.numbers[i]),
            None => self
                .spilled()
                .iter()
                .find(|(s, _)| *s == seq)
                .map(|&(_, n)| n),
        }
    }

    /// Sets the number of `seq`; answers whether `seq` is new here.
    pub(crate) fn set(&mut self, seq: SeqId, value: Number) -> bool {
        if let Some(n) = self.slot(seq) {
            *n = value;
            return false;
        }
        self.push(seq, value);
        true
    }

    /// Raises the number of `seq` to at least `value`; answers whether `seq` is new here.
    pub(crate) fn raise(&mut self, seq: SeqId, value: Number) -> bool {
        if let Some(n) = self.slot(seq) {
            *n = (*n).max(value);
            return false;
        }
        self.push(seq, value);
        true
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn push(&mut self, seq: SeqId, value: Number) {
        let len = usize::from(self.len);
        if len < INLINE_SEQS {
            self.seqs[len] = seq;
            self.numbers[len] = value;
            self.len += 1;
        } else {
            self.spill.get_or_insert_default().push((seq, value));
        }
    }
}

/// Numbers by workspace, with the count of numbers in all.
#[derive(Debug, Clone, Default)]
pub(crate) struct NumberMap {
    map: HashMap<WsId, WsNumbers>,
    len: usize,
}

impl NumberMap {
    /// How many numbers the map holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.len = 0;
    }

    pub(crate) fn get(&self, ws: WsId) -> Option<&WsNumbers> {
        self.map.get(&ws)
    }

    /// Workspaces and their numbers, in no particular order.
    pub(crate) fn workspaces(&self) -> impl Iterator<Item = (WsId, &WsNumbers)> {
        self.map.iter().map(|(&ws, n)| (ws, n))
    }

    /// Every number, one workspace's after another.
    pub(crate) fn values(&self) -> impl Iterator<Item = SeqValue> + '_ {
        self.map.iter().flat_map(|(&ws, n)| {
            n.iter().map(move |(seq, value)| SeqValue {
                key: NumberKey { ws, seq },
                value,
            })
        })
    }

    /// Sets numbers of workspace `ws`, with one lookup.
    pub(crate) fn set_all(&mut self, ws: WsId, numbers: impl IntoIterator<Item = (SeqId, Number)>) {
        let entry = self.map.entry(ws).or_default();
        for (seq, n) in numbers {
            if entry.set(seq, n) {
                self.len += 1;
            }
        }
    }

    /// Raises numbers of workspace `ws` to at least the given ones, with one lookup.
    pub(crate) fn raise_all(
        &mut self,
        ws: WsId,
        numbers: impl IntoIterator<Item = (SeqId, Number)>,
    ) {
        let mut numbers = numbers.into_iter().peekable();
        if numbers.peek().is_none() {
            return;
        }
        let entry = self.map.entry(ws).or_default();
        for (seq, n) in numbers {
            if entry.raise(seq, n) {
                self.len += 1;
            }
        }
    }

    /// Moves every number of `other` here (they replace this map's).
    pub(crate) fn take_from(&mut self, other: &mut NumberMap) {
        for (ws, numbers) in other.map.drain() {
            self.set_all(ws, numbers.iter());
        }
        other.len = 0;
    }

    /// Raises every number here to at least `other`'s (adds those missing).
    pub(crate) fn raise_from(&mut self, other: &NumberMap) {
        for (ws, numbers) in other.workspaces() {
            self.raise_all(ws, numbers.iter());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_spill_past_the_inline_slots_and_stay_readable() {
        let mut n = WsNumbers::default();
        for s in 1..=6u16 {
            assert!(n.set(SeqId(s), Number(u64::from(s) * 10)));
        }
        assert_eq!(n.len(), 6);
        assert!(!n.set(SeqId(5), Number(7)));
        assert_eq!(n.get(SeqId(5)), Some(Number(7)));
        assert_eq!(n.get(SeqId(2)), Some(Number(20)));
        assert_eq!(n.get(SeqId(9)), None);
    }

    #[test]
    fn number_map_counts_numbers_through_every_change() {
        let mut m = NumberMap::default();
        m.set_all(WsId(1), [(SeqId(1), Number(5)), (SeqId(2), Number(6))]);
        m.raise_all(WsId(1), [(SeqId(1), Number(3)), (SeqId(3), Number(1))]);
        m.raise_all(WsId(2), [(SeqId(1), Number(9))]);
        assert_eq!(m.len(), 4);
        assert_eq!(m.get(WsId(1)).unwrap().get(SeqId(1)), Some(Number(5)));
        let mut other = NumberMap::default();
        other.set_all(WsId(2), [(SeqId(1), Number(10))]);
        m.take_from(&mut other);
        assert!(other.is_empty());
        assert_eq!(m.len(), 4);
        let mut older = NumberMap::default();
        older.set_all(WsId(1), [(SeqId(1), Number(4)), (SeqId(4), Number(2))]);
        older.set_all(WsId(3), [(SeqId(1), Number(1))]);
        m.raise_from(&older);
        assert_eq!(m.len(), 6);
        assert_eq!(m.get(WsId(1)).unwrap().get(SeqId(1)), Some(Number(5)));
        assert_eq!(m.get(WsId(1)).unwrap().get(SeqId(4)), Some(Number(2)));
        assert_eq!(m.values().count(), 6);
    }

    #[test]
    fn a_workspace_with_its_map_key_fits_one_cache_line() {
        assert!(size_of::<(WsId, WsNumbers)>() <= 64);
    }

    #[test]
    fn raise_never_lowers_a_number() {
        let mut n = WsNumbers::default();
        assert!(n.raise(SeqId(1), Number(5)));
        assert!(!n.raise(SeqId(1), Number(3)));
        assert_eq!(n.get(SeqId(1)), Some(Number(5)));
        n.raise(SeqId(1), Number(8));
        assert_eq!(n.get(SeqId(1)), Some(Number(8)));
    }
}
