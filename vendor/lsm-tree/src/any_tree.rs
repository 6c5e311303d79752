// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::{BlobTree, Tree};
use enum_dispatch::enum_dispatch;

/// May be a standard [`Tree`] or a [`BlobTree`]
#[derive(Clone)]
#[enum_dispatch(AbstractTree)]
pub enum AnyTree {
    /// Standard LSM-tree, see [`Tree`]
    Standard(Tree),

    /// Key-value separated LSM-tree, see [`BlobTree`]
    Blob(BlobTree),
}

impl AnyTree {
    /// Stops this tree's compactions (monoseq patch): a merge under way is abandoned at its
    /// next look at the stop signal (every 4 096 items merged), its input tables kept and its
    /// unfinished output left as orphans that the next recovery deletes; later ones do not
    /// start. For a database that is closing.
    pub fn stop_compactions(&self) {
        match self {
            Self::Standard(tree) => tree.stop_signal.send(),
            Self::Blob(tree) => tree.index.stop_signal.send(),
        }
    }
}
