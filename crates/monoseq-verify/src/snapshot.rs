//! [`Snapshot`]: a private copy of a data directory to open the engine on. The embedded engine
//! recovers (may write) even when it opens read-only (`FjallStore::open_read_only`), so
//! verification never opens it on the operator's directory: it copies every file while holding a shared lock on the
//! engine's lock file (a running server holds it exclusively, so the copy is refused while one
//! runs, and a server cannot start in the middle of the copy), then works on the copy, which
//! is deleted when the snapshot is dropped. The original is only ever opened for reading.

use std::fs::File;
use std::path::{Path, PathBuf};

use monoseq_kv::FjallStore;
use monoseq_store::IDENTITY_FILE;

/// The engine's lock file inside a data directory.
const ENGINE_LOCK_FILE: &str = FjallStore::LOCK_FILE;
/// Prefix of the snapshot directory's name.
const SNAPSHOT_PREFIX: &str = ".monoseq-verify-";

/// Why a data directory could not be copied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The directory does not exist.
    #[error("data directory {0} does not exist; check the path (nothing was created)")]
    Missing(PathBuf),
    /// The path is not a directory.
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    /// The directory holds neither an identity file nor engine files.
    #[error(
        "{0} is not a monoseq data directory: it holds neither {IDENTITY_FILE} nor the engine's \
         files; check the path"
    )]
    NotADataDir(PathBuf),
    /// A server (or another process) has the engine open.
    #[error(
        "the data directory {0} is in use (its engine is locked by a running server); stop the \
         server and verify again"
    )]
    InUse(PathBuf),
    /// Reading the original or writing the copy failed.
    #[error("copying the data directory: {what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { what, path, source }
}

/// A temporary copy of a data directory, deleted on drop.
#[derive(Debug)]
pub struct Snapshot {
    dir: tempfile::TempDir,
    bytes: u64,
}

impl Snapshot {
    /// Copies data directory `dir` into a new temporary directory: beside `dir` when its
    /// parent is writable (same filesystem, usually more room than the system's temporary
    /// directory), else in the system's temporary directory. Changes nothing in `dir` and
    /// creates nothing when it fails.
    ///
    /// # Errors
    ///
    /// [`SnapshotError`]: the directory is missing, is not a data directory, is in use, or a
    /// file could not be copied.
    pub fn copy(dir: &Path) -> Result<Snapshot, SnapshotError> {
        let meta = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SnapshotError::Missing(dir.to_path_buf()));
            }
            Err(e) => return Err(io("reading", dir)(e)),
        };
        if !meta.is_dir() {
            return Err(SnapshotError::NotADirectory(dir.to_path_buf()));
        }
        if !FjallStore::holds_files(dir) && !dir.join(IDENTITY_FILE).exists() {
            return Err(SnapshotError::NotADataDir(dir.to_path_buf()));
        }
        let _lock = lock_shared(dir)?;
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
        let target = parent
            .and_then(|p| {
                tempfile::Builder::new()
                    .prefix(SNAPSHOT_PREFIX)
                    .tempdir_in(p)
                    .ok()
            })
            .map_or_else(
                || {
                    tempfile::Builder::new()
                        .prefix(SNAPSHOT_PREFIX)
                        .tempdir()
                        .map_err(io(
                            "creating a temporary directory in",
                            &std::env::temp_dir(),
                        ))
                },
                Ok,
            )?;
        let bytes = copy_tree(dir, target.path())?;
        Ok(Snapshot { dir: target, bytes })
    }

    /// Where the copy is.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// How many bytes were copied.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Takes a shared lock on the engine's lock file, if there is one; held until dropped.
fn lock_shared(dir: &Path) -> Result<Option<File>, SnapshotError> {
    let path = dir.join(ENGINE_LOCK_FILE);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("opening", &path)(e)),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(SnapshotError::InUse(dir.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(io("locking", &path)(e)),
    }
}

/// Copies the regular files and folders under `from` into `to`; returns the bytes copied.
fn copy_tree(from: &Path, to: &Path) -> Result<u64, SnapshotError> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(from).map_err(io("reading", from))? {
        let entry = entry.map_err(io("reading", from))?;
        let source = entry.path();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().map_err(io("reading", &source))?;
        if kind.is_dir() {
            std::fs::create_dir(&target).map_err(io("creating", &target))?;
            bytes += copy_tree(&source, &target)?;
        } else if kind.is_file() {
            bytes += std::fs::copy(&source, &target).map_err(io("copying", &source))?;
        } else {
            return Err(SnapshotError::Io {
                what: "copying",
                path: source,
                source: std::io::Error::other("not a regular file or folder"),
            });
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_is_an_error_and_nothing_is_created() {
        let parent = tempfile::tempdir().expect("temporary directory");
        let missing = parent.path().join("no-such-dir");
        let err = Snapshot::copy(&missing).expect_err("missing directory");
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(!missing.exists());
        assert_eq!(std::fs::read_dir(parent.path()).expect("list").count(), 0);
    }

    #[test]
    fn a_directory_without_identity_or_engine_files_is_refused() {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("notes.txt"), b"hello").expect("write");
        let err = Snapshot::copy(dir.path()).expect_err("not a data directory");
        assert!(
            err.to_string().contains("not a monoseq data directory"),
            "{err}"
        );
    }

    #[test]
    fn the_copy_holds_every_file_and_is_deleted_on_drop() {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join(IDENTITY_FILE), b"{}").expect("write");
        std::fs::create_dir_all(dir.path().join("keyspaces/0")).expect("mkdir");
        std::fs::write(dir.path().join("keyspaces/0/data"), b"12345").expect("write");
        let snap = Snapshot::copy(dir.path()).expect("copy");
        assert_eq!(snap.bytes(), 7);
        assert_eq!(
            std::fs::read(snap.path().join("keyspaces/0/data")).expect("read"),
            b"12345"
        );
        let copy = snap.path().to_path_buf();
        drop(snap);
        assert!(!copy.exists());
    }

    #[test]
    fn a_locked_engine_is_refused_as_in_use() {
        let dir = tempfile::tempdir().expect("temporary directory");
        std::fs::write(dir.path().join("version"), b"x").expect("write");
        let lock = File::create(dir.path().join(ENGINE_LOCK_FILE)).expect("lock file");
        lock.try_lock().expect("exclusive lock");
        let err = Snapshot::copy(dir.path()).expect_err("in use");
        assert!(err.to_string().contains("in use"), "{err}");
        lock.unlock().expect("unlock");
        Snapshot::copy(dir.path()).expect("copy once unlocked");
    }
}
