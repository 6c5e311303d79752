//! The data directory's identity file (`monoseq.identity`): which store the directory holds
//! (a random store ID also written inside the engine), its formats and partition count, and
//! every loss an operator accepted. Ours, beside the engine's files, written atomically
//! (temporary file, sync, rename, sync of the directory), so a crash leaves the old or the new
//! file, never a mix.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::marks::Mark;

/// The identity file's name inside the data directory.
pub const IDENTITY_FILE: &str = "monoseq.identity";
/// The identity format this build writes and reads.
pub const IDENTITY_FORMAT: u32 = 1;

/// What a data directory holds, as its identity file records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Version of this file's own format.
    pub format: u32,
    /// Random ID given when the store was created; the engine holds it too, so a directory
    /// whose engine files were replaced or lost is told apart from its own.
    pub store_id: String,
    /// The event store's key layout (`docs/format.md`).
    pub key_layout: u32,
    /// The event encoding's version.
    pub event_format: u8,
    /// Partition count; workspaces are routed by `ws mod partitions`.
    pub partitions: u32,
    /// When the store was created (Unix milliseconds).
    pub created_at_ms: u64,
    /// Losses an operator accepted (`--accept-loss`), oldest first.
    #[serde(default)]
    pub losses: Vec<AcceptedLoss>,
}

/// A loss of acknowledged events that an operator accepted: the PLog offsets that are gone,
/// and the numbers handed out before it, which are never handed out again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedLoss {
    /// The partition.
    pub partition: u32,
    /// First lost PLog offset.
    pub plog_from: u64,
    /// Last lost PLog offset (the high-water mark at the time).
    pub plog_to: u64,
    /// The high-water mark when the loss was accepted: every number at or below it stays
    /// retired.
    pub mark: Mark,
    /// When the loss was accepted (Unix milliseconds).
    pub accepted_at_ms: u64,
    /// How the loss came about (files written before this field name none: an accepted loss).
    #[serde(default)]
    pub cause: LossCause,
}

/// How numbers of an [`AcceptedLoss`] came to be retired; readers of the PLog are told it with
/// the gap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LossCause {
    /// An operator started with `--accept-loss` over a store that lost acknowledged events.
    #[default]
    AcceptedLoss,
    /// A restored backup was continued: what the store acknowledged after the backup is gone.
    Restore,
}

impl LossCause {
    /// The stable name (`accepted_loss`, `restore`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::AcceptedLoss => "accepted_loss",
            LossCause::Restore => "restore",
        }
    }
}

/// The identity file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// Reading or writing the file failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but is not a valid identity.
    #[error(
        "identity file {path} is damaged ({reason}); restore it from a backup of this data \
         directory, or start with --accept-loss to rebuild it from what the engine holds"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Identity {
    /// A new identity with a fresh random store ID.
    #[must_use]
    pub fn new(partitions: u32, key_layout: u32, event_format: u8) -> Identity {
        Identity {
            format: IDENTITY_FORMAT,
            store_id: new_store_id(),
            key_layout,
            event_format,
            partitions,
            created_at_ms: now_ms(),
            losses: Vec::new(),
        }
    }

    /// The path of the identity file in `dir`.
    #[must_use]
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(IDENTITY_FILE)
    }

    /// Reads the identity of data directory `dir`; `None` when it has no identity file.
    ///
    /// # Errors
    ///
    /// [`IdentityError`] when the file cannot be read or is damaged.
    pub fn read(dir: &Path) -> Result<Option<Identity>, IdentityError> {
        let path = Identity::path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(IdentityError::Damaged {
                    path,
                    reason: "not UTF-8 text".into(),
                });
            }
            Err(source) => {
                return Err(IdentityError::Io {
                    what: "reading identity file",
                    path,
                    source,
                });
            }
        };
        let identity: Identity =
            serde_json::from_str(&text).map_err(|e| IdentityError::Damaged {
                path: path.clone(),
                reason: monoseq_kv::chain(&e),
            })?;
        if identity.format != IDENTITY_FORMAT {
            return Err(IdentityError::Damaged {
                path,
                reason: format!(
                    "format {} (this build reads format {IDENTITY_FORMAT})",
                    identity.format
                ),
            });
        }
        if identity.partitions == 0 || identity.store_id.is_empty() {
            return Err(IdentityError::Damaged {
                path,
                reason: "no partitions or no store ID".into(),
            });
        }
        Ok(Some(identity))
    }

    /// Writes the identity into `dir` atomically and durably: a crash leaves either the old
    /// file or this one.
    ///
    /// # Errors
    ///
    /// [`IdentityError::Io`] when writing, syncing or renaming failed.
    pub fn write(&self, dir: &Path) -> Result<(), IdentityError> {
        let path = Identity::path(dir);
        let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| IdentityError::Io { what, path, source }
        };
        let mut text = serde_json::to_string_pretty(self).map_err(|e| IdentityError::Damaged {
            path: path.clone(),
            reason: monoseq_kv::chain(&e),
        })?;
        text.push('\n');
        let mut file = std::fs::File::create(&tmp).map_err(io("creating", &tmp))?;
        file.write_all(text.as_bytes())
            .map_err(io("writing", &tmp))?;
        file.sync_all().map_err(io("syncing", &tmp))?;
        drop(file);
        std::fs::rename(&tmp, &path).map_err(io("renaming into place", &path))?;
        sync_dir(dir).map_err(io("syncing directory", dir))
    }

    /// The losses accepted for `partition`, oldest first.
    pub fn losses_of(&self, partition: u32) -> impl Iterator<Item = &AcceptedLoss> + '_ {
        self.losses.iter().filter(move |l| l.partition == partition)
    }

    /// The mark below which numbers of `partition` are retired by accepted losses (the
    /// highest of their marks).
    #[must_use]
    pub fn retired(&self, partition: u32) -> Mark {
        self.losses_of(partition)
            .fold(Mark::default(), |m, l| m.max(&l.mark))
    }
}

/// Makes a rename or creation inside `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// 128 random bits as 32 hex digits, from the standard library's per-process random hash keys
/// mixed with the time and process ID.
fn new_store_id() -> String {
    let mut parts = [0u64; 2];
    for (i, part) in parts.iter_mut().enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        h.write_usize(i);
        *part = h.finish();
    }
    format!("{:016x}{:016x}", parts[0], parts[1])
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_written_is_read_back_whole() {
        let dir = tempfile::tempdir().expect("temporary directory");
        assert!(Identity::read(dir.path()).expect("read").is_none());
        let mut id = Identity::new(8, 3, 1);
        id.losses.push(AcceptedLoss {
            partition: 2,
            plog_from: 10,
            plog_to: 12,
            mark: Mark {
                plog: 12,
                wlog: 5,
                crecord: 7,
                owrecord: 9,
            },
            accepted_at_ms: 1,
            cause: crate::LossCause::AcceptedLoss,
        });
        id.write(dir.path()).expect("write");
        let back = Identity::read(dir.path()).expect("read").expect("present");
        assert_eq!(back, id);
        assert_eq!(back.retired(2).wlog, 5);
        assert_eq!(back.retired(3), Mark::default());
        assert!(!dir.path().join("monoseq.identity.tmp").exists());
    }

    #[test]
    fn a_damaged_identity_is_an_error_that_says_what_to_do() {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(Identity::path(dir.path()), b"{\"format\": 1, \"store_").expect("write");
        let err = Identity::read(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("damaged") && err.contains("--accept-loss"),
            "{err}"
        );
    }

    #[test]
    fn store_ids_differ() {
        assert_ne!(new_store_id(), new_store_id());
        assert_eq!(new_store_id().len(), 32);
    }
}
