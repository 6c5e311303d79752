//! The bodies of administration (`/v1/admin/*`, an admin token): a backup's request and
//! answer.

use serde::{Deserialize, Serialize};

/// The body of `POST /v1/admin/backup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRequestBody {
    /// The new directory to write the backup into, on the server's machine: absolute, under
    /// the server's `--backup-root`, not existing yet (its parent existing).
    pub to: String,
}

/// The answer of `POST /v1/admin/backup`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupBody {
    /// Where the backup is (symbolic links of its parent resolved).
    pub to: String,
    /// The store copied.
    pub store_id: String,
    /// When its instant was fixed (Unix milliseconds).
    pub taken_at_ms: u64,
    /// Each partition's acknowledged PLog offset at the backup.
    pub plog_marks: Vec<u64>,
    /// Keys copied.
    pub keys: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// How long fixing the instant took (the only step on the writers' path; no command waits
    /// for the copy), microseconds.
    pub instant_us: u64,
    /// How long the whole backup took, milliseconds.
    pub took_ms: u64,
}
