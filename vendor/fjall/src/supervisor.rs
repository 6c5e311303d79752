// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use lsm_tree::SequenceNumberCounter;

use crate::{
    db::Keyspaces,
    flush::manager::FlushManager,
    journal::{manager::JournalManager, Journal},
    snapshot_tracker::SnapshotTracker,
    write_buffer_manager::WriteBufferManager,
};
use std::sync::{Arc, Mutex, RwLock};

pub struct SupervisorInner {
    pub db_config: crate::Config,

    /// Dictionary of all keyspaces
    #[doc(hidden)]
    pub keyspaces: Arc<RwLock<Keyspaces>>,

    pub(crate) write_buffer_size: WriteBufferManager,
    pub(crate) flush_manager: FlushManager,

    pub seqno: SequenceNumberCounter,

    pub snapshot_tracker: SnapshotTracker,

    pub(crate) journal: Arc<Journal>,

    /// Tracks journal size and garbage collects sealed journals when possible
    pub(crate) journal_manager: Arc<RwLock<JournalManager>>,

    pub(crate) backpressure_lock: Mutex<()>,

    /// Memtables rotated out, held until no version refers to them any more, then freed by
    /// the rotation or the flush worker that finds them so, after it released every lock
    /// (monoseq patch: freeing a memtable of a few hundred thousand entries takes about
    /// 100 ms, which the version history's maintenance spent holding the lock every reader
    /// and writer takes).
    pub(crate) retired_memtables: Mutex<Vec<Arc<lsm_tree::Memtable>>>,

    /// Versions a rotation's version maintenance took out of a keyspace's history, dropped by
    /// the flush worker after its next flush (monoseq patch: dropping the last version that
    /// refers to a table a compaction replaced deletes the table's file, tens of them after a
    /// merge, which held up every writer while the rotating writer held the history's lock,
    /// and then that writer).
    pub(crate) retired_versions: Mutex<Vec<lsm_tree::RetiredVersions>>,
}

#[derive(Clone)]
pub struct Supervisor(Arc<SupervisorInner>);

impl std::ops::Deref for Supervisor {
    type Target = SupervisorInner;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Supervisor {
    pub fn new(inner: SupervisorInner) -> Self {
        Self(Arc::new(inner))
    }

    /// Holds `memtable` (just rotated out) until no version refers to it, and frees the ones
    /// held before that no version refers to any more; called with no lock held, so that the
    /// freeing blocks no reader or writer.
    pub(crate) fn retire_memtable(&self, memtable: Arc<lsm_tree::Memtable>) {
        self.free_retired_memtables(Some(memtable));
    }

    /// Frees the retired memtables no version refers to any more, after adding `memtable`.
    fn free_retired_memtables(&self, memtable: Option<Arc<lsm_tree::Memtable>>) {
        let unused: Vec<Arc<lsm_tree::Memtable>> = {
            #[expect(clippy::expect_used)]
            let mut retired = self.retired_memtables.lock().expect("lock is poisoned");
            retired.extend(memtable);
            let (unused, held) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(|m| Arc::strong_count(m) == 1);
            *retired = held;
            unused
        };
        if !unused.is_empty() {
            log::debug!("Freeing {} flushed memtable(s)", unused.len());
        }
        drop(unused);
    }

    /// Holds versions a rotation took out of a keyspace's history until the flush worker
    /// drops them (`drop_retired_versions`).
    pub(crate) fn retire_versions(&self, versions: lsm_tree::RetiredVersions) {
        if versions.is_empty() {
            return;
        }
        #[expect(clippy::expect_used)]
        self.retired_versions
            .lock()
            .expect("lock is poisoned")
            .push(versions);
    }

    /// Drops the versions rotations retired, deleting the files of the tables no version
    /// refers to any more, and then frees the retired memtables those versions were the last
    /// to refer to; called by the flush worker with no lock held.
    pub(crate) fn drop_retired_versions(&self) {
        let retired = {
            #[expect(clippy::expect_used)]
            let mut held = self.retired_versions.lock().expect("lock is poisoned");
            std::mem::take(&mut *held)
        };
        if retired.is_empty() {
            return;
        }
        log::debug!(
            "Dropping {} retired version(s)",
            retired.iter().map(lsm_tree::RetiredVersions::len).sum::<usize>()
        );
        drop(retired);
        self.free_retired_memtables(None);
    }

    pub fn build_seqno_map(
        &self,
        keyspaces: &Keyspaces,
    ) -> Vec<crate::journal::manager::EvictionWatermark> {
        use crate::AbstractTree;

        let mut seqnos = Vec::with_capacity(keyspaces.len());

        for keyspace in keyspaces.values() {
            if let Some(lsn) = keyspace.tree.get_highest_memtable_seqno() {
                seqnos.push(crate::journal::manager::EvictionWatermark {
                    lsn,
                    keyspace: keyspace.clone(),
                });
            }
        }

        seqnos
    }
}
