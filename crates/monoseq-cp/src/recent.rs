//! The records a partition's writer wrote lately, as it wrote them, so that an update of one
//! of them does not read it from the store again. Bounded in bytes: two generations of at
//! most half the budget each, the older dropped whole when the newer is full. Only the partition's writer
//! writes its workspaces' records while it serves, so what it wrote is what is stored; a
//! writer starts empty (at a start, a takeover, a rebuild) and forgets everything when a
//! group's write fails.

use std::collections::HashMap;
use std::mem::size_of;

use monoseq_core::WsId;
use monoseq_store::{Field, Record, RecordId, StoredRecords};

/// Default bytes of lately written records a processor keeps, all partitions together (each
/// partition gets its share).
pub const RECENT_RECORDS_BYTES_DEFAULT: usize = 64 << 20;

type Generation = HashMap<(WsId, RecordId), Record>;

/// Records written lately, by workspace and ID.
#[derive(Debug, Default)]
pub(crate) struct RecentRecords {
    newer: Generation,
    older: Generation,
    /// Bytes held by `newer` and by `older`.
    bytes: (usize, usize),
    /// Most bytes held: a generation is retired when it holds half.
    budget: usize,
}

/// The memory a record takes, roughly: its parts and the heap blocks behind them.
fn footprint(r: &Record) -> usize {
    let fields: usize = r
        .fields
        .iter()
        .map(|f| size_of::<Field>() + f.name.len() + f.value.len())
        .sum();
    size_of::<(WsId, RecordId)>() + size_of::<Record>() + r.name.len() + fields
}

impl RecentRecords {
    /// Keeps at most about `budget` bytes of records (0: none).
    pub(crate) fn new(budget: usize) -> RecentRecords {
        RecentRecords {
            budget,
            ..RecentRecords::default()
        }
    }

    /// Record `id` of `ws` as this writer last wrote it, taken out (the group that takes it
    /// gives it back, merged, once written).
    pub(crate) fn take(&mut self, ws: WsId, id: RecordId) -> Option<Record> {
        if let Some(r) = self.newer.remove(&(ws, id)) {
            self.bytes.0 -= footprint(&r);
            return Some(r);
        }
        let r = self.older.remove(&(ws, id))?;
        self.bytes.1 -= footprint(&r);
        Some(r)
    }

    /// Keeps the records a group wrote, as written.
    pub(crate) fn keep(&mut self, written: StoredRecords) {
        for (ws, record) in written.into_records() {
            self.put(ws, record);
        }
    }

    fn put(&mut self, ws: WsId, record: Record) {
        let size = footprint(&record);
        if size > self.budget / 2 {
            return;
        }
        if let Some(old) = self.older.remove(&(ws, record.id)) {
            self.bytes.1 -= footprint(&old);
        }
        if let Some(old) = self.newer.remove(&(ws, record.id)) {
            self.bytes.0 -= footprint(&old);
        }
        // Each generation holds at most half the budget.
        if self.bytes.0 + size > self.budget / 2 {
            self.older = std::mem::take(&mut self.newer);
            self.bytes = (0, self.bytes.0);
        }
        self.newer.insert((ws, record.id), record);
        self.bytes.0 += size;
    }

    /// Forgets every record (a group's write failed: what is stored is not known).
    pub(crate) fn clear(&mut self) {
        self.newer = Generation::new();
        self.older = Generation::new();
        self.bytes = (0, 0);
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.0 + self.bytes.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use monoseq_store::RecordKind;

    fn record(id: u64, value: &str) -> Record {
        Record {
            id: RecordId(id),
            kind: RecordKind::CDoc,
            name: "app.Doc".into(),
            fields: vec![Field::new("n", value.as_bytes().to_vec())],
        }
    }

    fn written(records: impl IntoIterator<Item = Record>) -> StoredRecords {
        let mut s = StoredRecords::new();
        for r in records {
            s.insert(WsId(1), r);
        }
        s
    }

    #[test]
    fn a_record_kept_is_taken_once_as_written() {
        let mut recent = RecentRecords::new(1 << 20);
        recent.keep(written([record(5, "1")]));
        assert_eq!(recent.take(WsId(1), RecordId(5)), Some(record(5, "1")));
        assert_eq!(recent.take(WsId(1), RecordId(5)), None);
        assert_eq!(
            recent.take(WsId(2), RecordId(5)),
            None,
            "another workspace's"
        );
        assert_eq!(recent.bytes(), 0);
    }

    #[test]
    fn the_records_held_stay_within_the_budget_and_the_latest_are_kept() {
        let one = footprint(&record(1, "1"));
        let budget = one * 10;
        let mut recent = RecentRecords::new(budget);
        for id in 1..=1_000 {
            recent.keep(written([record(id, "1")]));
            assert!(recent.bytes() <= budget, "{} bytes held", recent.bytes());
        }
        assert!(recent.take(WsId(1), RecordId(1_000)).is_some());
        assert!(recent.take(WsId(1), RecordId(1)).is_none());
    }

    #[test]
    fn a_record_kept_again_replaces_the_older_copy() {
        let mut recent = RecentRecords::new(1 << 20);
        recent.keep(written([record(5, "1")]));
        recent.keep(written([record(5, "22")]));
        assert_eq!(recent.bytes(), footprint(&record(5, "22")));
        assert_eq!(recent.take(WsId(1), RecordId(5)), Some(record(5, "22")));
    }

    #[test]
    fn nothing_is_kept_without_a_budget_or_after_a_clear() {
        let mut none = RecentRecords::new(0);
        none.keep(written([record(5, "1")]));
        assert_eq!(none.take(WsId(1), RecordId(5)), None);
        let mut recent = RecentRecords::new(1 << 20);
        recent.keep(written([record(5, "1")]));
        recent.clear();
        assert_eq!(recent.take(WsId(1), RecordId(5)), None);
        assert_eq!(recent.bytes(), 0);
    }
}
