//! Backups of the embedded store: `POST /v1/admin/backup` (an admin token) copies the running
//! store into a new directory under `serve --backup-root` and nowhere else (the rules a target
//! must pass are [`check_target`]'s), and `monoseq backup` asks for it through the client
//! crate; `--marks-from` and `--skip-ahead` continue a restored copy
//! (`monoseq_store::backup`).
//!
//! The copy is consistent without holding commands: the marks are read first, then the
//! engine's instant is fixed by one snapshot, a state a crash at that instant could have left
//! (each batch whole), which the store recovers from. With the PLog in the engine a mark is
//! raised only after its group was written there, so the snapshot covers every mark read.
//! With segment files a mark is raised once its group's frames are durable in their log (the
//! engine may still lack the group's batch, written after the raise on a shared flush), and
//! the segment files are copied after the engine's instant, each log whole up to its end then:
//! every event the marks cover and the copied engine applied, and more, which the copy's first
//! start applies to its engine.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Args;
use monoseq_kv::EmbeddedStore;
use monoseq_store::{BackupStamp, Identity, Marks, Restore};
use monoseq_wire::{BackupBody, BackupRequestBody, ErrorCode};

use crate::base::error;

/// The route of a backup.
pub const BACKUP_PATH: &str = "/v1/admin/backup";

/// Where `serve` may write backups.
#[derive(Debug, Clone, Default, Args)]
pub struct BackupRootArgs {
    /// Directory under which backups are written: `POST /v1/admin/backup` (an admin token)
    /// creates a new directory under it and nowhere else (never through a symbolic link that
    /// leaves it, never into the data directory). It must exist. Without it backups are
    /// refused (403 `backups_disabled`). Embedded store only.
    #[arg(long, env = "MONOSEQ_BACKUP_ROOT", value_name = "DIR")]
    pub backup_root: Option<PathBuf>,
}

/// The backup root as `serve` uses it: `given` (the settings file's `backup_root`, or the
/// flag) checked, made absolute and its symbolic links resolved.
///
/// # Errors
///
/// An empty path, a root that does not exist or is no directory, a root inside the data
/// directory, or a root given to a server on PostgreSQL.
pub fn resolve_root(
    given: Option<&Path>,
    settings: &crate::config::Settings,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(given) = given else {
        return Ok(None);
    };
    if given.as_os_str().is_empty() {
        bail!("--backup-root is empty: give the directory backups are written under");
    }
    if let crate::config::Storage::Postgres(_) = settings.storage {
        bail!(
            "--backup-root {} is given, but this server runs on PostgreSQL, which monoseq does \
             not back up: drop the flag and back the database up with its own tools \
             (pg_basebackup, point-in-time recovery; see docs/backups.md)",
            given.display()
        );
    }
    let meta = std::fs::metadata(given).map_err(|e| {
        anyhow::anyhow!(
            "--backup-root {}: {e}; create the directory first (mkdir -m 700), or give another",
            given.display()
        )
    })?;
    if !meta.is_dir() {
        bail!(
            "--backup-root {} is not a directory: give the directory backups are written under",
            given.display()
        );
    }
    let root = std::fs::canonicalize(given)
        .with_context(|| format!("--backup-root {}: resolving the path", given.display()))?;
    let data = resolved(&settings.data_dir);
    if root.starts_with(&data) {
        bail!(
            "--backup-root {} lies inside the data directory {}: a backup there would be \
             copied into the next backup and lost with the data; give a directory outside it",
            given.display(),
            settings.data_dir.display()
        );
    }
    Ok(Some(root))
}

/// `path` with its symbolic links resolved when it exists, else made absolute.
fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// A backup target that breaks a rule: answered 400 with `code`, nothing written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The stable code naming the rule.
    pub code: ErrorCode,
    /// What was wrong and what to do.
    pub message: String,
}

fn refused(code: ErrorCode, message: String) -> Refused {
    Refused { code, message }
}

/// Where a backup asked for `to` may be written: a new directory whose parent, its symbolic
/// links resolved, is `root` or under it (`root` and `data_dir` resolved already), outside the
/// data directory. Answers the target with its parent resolved; creates nothing.
///
/// # Errors
///
/// The rule `to` breaks, in this order: `backup_path_empty`, `backup_path_relative`,
/// `backup_path_not_normal` (a `..` component or no last name), `backup_path_outside_root`,
/// `backup_path_parent_missing`, `backup_path_leaves_root` (a symbolic link on the way leads
/// out of the root), `backup_path_in_data_dir`, `backup_path_is_file`, `backup_path_exists`
/// (a directory, a symbolic link or anything else already there).
pub fn check_target(root: &Path, data_dir: &Path, to: &str) -> Result<PathBuf, Refused> {
    use std::path::Component;
    let under_root = format!("a new directory under the backup root {}", root.display());
    if to.is_empty() {
        return Err(refused(
            ErrorCode::BackupPathEmpty,
            format!("the backup path is empty: give {under_root}"),
        ));
    }
    let path = Path::new(to);
    if !path.is_absolute() {
        return Err(refused(
            ErrorCode::BackupPathRelative,
            format!("the backup path {to} is relative: give {under_root}, as an absolute path"),
        ));
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(refused(
            ErrorCode::BackupPathNotNormal,
            format!("the backup path {to} names no new directory: give {under_root}"),
        ));
    };
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(refused(
            ErrorCode::BackupPathNotNormal,
            format!("the backup path {to} holds `..`: give {under_root} without `..`"),
        ));
    }
    let parent = resolve_parent(root, path, parent, &under_root)?;
    let target = parent.join(name);
    if target.starts_with(data_dir) {
        return Err(refused(
            ErrorCode::BackupPathInDataDir,
            format!(
                "the backup path {to} lies inside the data directory {}: give {under_root} \
                 outside it",
                data_dir.display()
            ),
        ));
    }
    refuse_existing(&target, to, &under_root)?;
    Ok(target)
}

/// The parent of `path` (asked for a backup) with its symbolic links resolved: it exists and
/// lies under `root`.
fn resolve_parent(
    root: &Path,
    path: &Path,
    parent: &Path,
    under_root: &str,
) -> Result<PathBuf, Refused> {
    let to = path.display();
    // As given, under the root (or an alias of it through a link the root itself is).
    let named_under = path != root && path.starts_with(root);
    let resolved = match std::fs::canonicalize(parent) {
        Ok(p) => p,
        Err(_) if !named_under => {
            return Err(refused(
                ErrorCode::BackupPathOutsideRoot,
                format!("the backup path {to} is not under the backup root: give {under_root}"),
            ));
        }
        Err(e) => {
            return Err(refused(
                ErrorCode::BackupPathParentMissing,
                format!(
                    "the parent directory of the backup path {to} cannot be used ({e}): create \
                     it first, or write directly under the backup root {}",
                    root.display()
                ),
            ));
        }
    };
    if !resolved.starts_with(root) {
        return Err(if named_under {
            refused(
                ErrorCode::BackupPathLeavesRoot,
                format!(
                    "the backup path {to} passes through a symbolic link that leads to {}, out \
                     of the backup root: give {under_root} without links that leave it",
                    resolved.display()
                ),
            )
        } else {
            refused(
                ErrorCode::BackupPathOutsideRoot,
                format!("the backup path {to} is not under the backup root: give {under_root}"),
            )
        });
    }
    Ok(resolved)
}

/// Refuses `target` (asked as `to`) when anything is there already, or it cannot be looked at.
fn refuse_existing(target: &Path, to: &str, under_root: &str) -> Result<(), Refused> {
    match std::fs::symlink_metadata(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(meta) if meta.is_file() => Err(refused(
            ErrorCode::BackupPathIsFile,
            format!("the backup path {to} is a file: give {under_root} that does not exist yet"),
        )),
        Ok(meta) => {
            let what = if meta.is_symlink() {
                "a symbolic link"
            } else if meta.is_dir() {
                "a directory"
            } else {
                "something"
            };
            Err(refused(
                ErrorCode::BackupPathExists,
                format!(
                    "the backup path {to} exists already ({what}): a backup is written only \
                     into {under_root} that does not exist yet"
                ),
            ))
        }
        Err(e) => Err(refused(
            ErrorCode::BackupPathParentMissing,
            format!("the backup path {to} cannot be looked at ({e}): give {under_root}"),
        )),
    }
}

/// Creates the directory `target` ([`check_target`]'s answer), only it and only if it does
/// not exist, and checks again, once it exists, that it lies under `root` (a link swapped in
/// meanwhile is caught; the empty directory is then removed).
fn claim(root: &Path, target: &Path) -> Result<(), Refused> {
    match std::fs::DirBuilder::new().mode(0o700).create(target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(refused(
                ErrorCode::BackupPathExists,
                format!(
                    "the backup path {} exists already: a backup is written only into a new \
                     directory",
                    target.display()
                ),
            ));
        }
        Err(e) => {
            return Err(refused(
                ErrorCode::BackupPathParentMissing,
                format!(
                    "creating the backup directory {} failed: {e}",
                    target.display()
                ),
            ));
        }
    }
    match std::fs::canonicalize(target) {
        Ok(made) if made.starts_with(root) => Ok(()),
        _ => {
            let _ = std::fs::remove_dir(target);
            Err(refused(
                ErrorCode::BackupPathLeavesRoot,
                format!(
                    "the backup path {} was redirected out of the backup root {} while it was \
                     created; nothing was written",
                    target.display(),
                    root.display()
                ),
            ))
        }
    }
}

/// How `serve` continues a restored backup.
#[derive(Debug, Clone, Default, Args)]
pub struct RestoreArgs {
    /// Continue a restored backup above the live marks: the `monoseq.marks` file, or the data
    /// directory, of the machine the backup was taken from. Every number up to them is
    /// retired. Needed once, at the first start of a restored copy.
    #[arg(long, value_name = "PATH", conflicts_with = "skip_ahead")]
    pub marks_from: Option<PathBuf>,
    /// Continue a restored backup N above the backup's marks, when the live marks are lost:
    /// every sequence (PLog and WLog offsets, record IDs) of every partition skips N. Needed
    /// once, at the first start of a restored copy.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub skip_ahead: Option<u64>,
}

impl RestoreArgs {
    /// What the flags ask.
    #[must_use]
    pub fn resolve(&self) -> Option<Restore> {
        match (&self.marks_from, self.skip_ahead) {
            (Some(path), _) => Some(Restore::MarksFrom(path.clone())),
            (None, Some(n)) => Some(Restore::SkipAhead(n)),
            (None, None) => None,
        }
    }
}

/// `monoseq backup`'s flags.
#[derive(Debug, Clone, Args)]
pub struct BackupArgs {
    /// The running server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// The new directory to write the backup into, on the server's machine, under its
    /// --backup-root (it must not exist, its parent must; a relative path is taken from the
    /// current directory).
    #[arg(long)]
    pub to: PathBuf,
    /// An admin token of the server; prefer the environment variable.
    #[arg(long, env = "MONOSEQ_TOKEN", hide_env_values = true)]
    pub token: Option<crate::auth::TokenArg>,
    /// PEM file of the CA certificate(s) to trust for an https --url [default: the system's
    /// trusted CAs].
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
}

/// What a backup needs of the running server.
pub struct Backups {
    kv: Arc<EmbeddedStore>,
    /// The PLogs' segment files, copied after the engine.
    segments: Option<Arc<monoseq_store::Segments>>,
    marks: Arc<Marks>,
    identity: Identity,
    /// The data directory, resolved.
    data_dir: PathBuf,
    /// `--backup-root`, resolved; `None`: backups are disabled.
    root: Option<PathBuf>,
    /// One backup at a time.
    running: tokio::sync::Mutex<()>,
}

impl Backups {
    /// The backups of an embedded store; `None` for PostgreSQL (its own tools back it up).
    pub fn new(
        settings: &crate::config::Settings,
        opened: &crate::storage::Opened,
    ) -> Option<Backups> {
        Some(Backups {
            kv: Arc::clone(opened.embedded.as_ref()?),
            segments: opened.segments.clone(),
            marks: Arc::clone(opened.marks.as_ref()?),
            identity: opened.identity.clone(),
            data_dir: resolved(&settings.data_dir),
            root: settings.backup_root.clone(),
            running: tokio::sync::Mutex::new(()),
        })
    }

    /// `POST /v1/admin/backup`, behind the token check of `auth` (an admin token).
    pub fn router(backups: Option<Backups>, auth: Arc<crate::auth::Auth>) -> Router {
        Router::new()
            .route(BACKUP_PATH, post(take))
            .with_state(backups.map(Arc::new))
            .layer(axum::middleware::from_fn(crate::query::refuse_unknown))
            .layer(axum::middleware::from_fn_with_state(
                auth,
                crate::auth::require_token,
            ))
    }

    /// Copies the store into the new, empty directory `to`: the stamp first (so an
    /// interrupted copy is never taken for a whole store), then the engine at one instant, its
    /// identity, and the marks read just before that instant. On a failure `to` is removed.
    fn take(&self, to: &Path, started: Instant) -> anyhow::Result<BackupBody> {
        let written = (|| {
            // Read before the engine's instant: every mark is covered by the copy.
            let marks = self.marks.all();
            let stamp = BackupStamp {
                format: monoseq_store::BACKUP_FORMAT,
                store_id: self.identity.store_id.clone(),
                partitions: self.identity.partitions,
                taken_at_ms: now_ms(),
                marks: marks.clone(),
            };
            stamp.write(to)?;
            let mut stats = self.kv.copy_to(to).context("copying the engine")?;
            // After the engine's instant: each log holds at least what the engine applied and
            // the marks cover (a restart writes the rest into the copy's engine again).
            if let Some(segments) = &self.segments {
                stats.bytes += segments
                    .copy_to(to)
                    .context("copying the PLog's segments")?;
            }
            self.identity.write(to)?;
            Marks::create_with(to, &marks)?;
            anyhow::Ok((stamp, stats))
        })();
        let (stamp, stats) = match written {
            Ok(w) => w,
            Err(e) => {
                let _ = std::fs::remove_dir_all(to);
                return Err(e);
            }
        };
        Ok(BackupBody {
            to: to.display().to_string(),
            store_id: stamp.store_id,
            taken_at_ms: stamp.taken_at_ms,
            plog_marks: stamp.marks.iter().map(|m| m.plog).collect(),
            keys: stats.keys,
            bytes: stats.bytes,
            instant_us: micros(stats.snapshot),
            took_ms: started.elapsed().as_millis() as u64,
        })
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().try_into().unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Why a backup was not taken.
enum NotTaken {
    /// The target breaks a rule: 400, nothing written.
    Refused(Refused),
    /// The copy failed: 500, the target removed.
    Failed(anyhow::Error),
}

/// `POST /v1/admin/backup`.
async fn take(
    State(backups): State<Option<Arc<Backups>>>,
    body: Result<axum::Json<BackupRequestBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(backups) = backups else {
        return error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "this server runs on PostgreSQL: back the database up with its own tools \
             (pg_basebackup, point-in-time recovery; see docs/backups.md)",
        );
    };
    let Some(root) = backups.root.clone() else {
        return error(
            StatusCode::FORBIDDEN,
            ErrorCode::BackupsDisabled,
            "backups are disabled on this server: restart it with --backup-root DIR to allow \
             backups into new directories under DIR",
        );
    };
    let to = match body {
        Ok(axum::Json(r)) => r.to,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::MalformedJson,
                e.body_text(),
            );
        }
    };
    if let Err(r) = check_target(&root, &backups.data_dir, &to) {
        return error(StatusCode::BAD_REQUEST, r.code, r.message);
    }
    let Ok(_one) = backups.running.try_lock() else {
        return error(
            StatusCode::CONFLICT,
            ErrorCode::BackupRunning,
            "a backup is being taken; wait for it to end",
        );
    };
    let taking = Arc::clone(&backups);
    let asked = to.clone();
    let done = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        // Checked again under the lock, then created: only a new directory under the root.
        let target = check_target(&root, &taking.data_dir, &asked).map_err(NotTaken::Refused)?;
        claim(&root, &target).map_err(NotTaken::Refused)?;
        taking.take(&target, started).map_err(NotTaken::Failed)
    })
    .await;
    answer(done, &to)
}

/// The answer of a backup into `to` that ran (or panicked).
fn answer(
    done: Result<Result<BackupBody, NotTaken>, tokio::task::JoinError>,
    to: &str,
) -> Response {
    match done {
        Ok(Ok(answer)) => {
            tracing::info!(
                to = %answer.to,
                keys = answer.keys,
                bytes = answer.bytes,
                instant_us = answer.instant_us,
                took_ms = answer.took_ms,
                "backup taken: commands were not held; fixing its instant took {} µs",
                answer.instant_us
            );
            axum::Json(answer).into_response()
        }
        Ok(Err(NotTaken::Refused(r))) => error(StatusCode::BAD_REQUEST, r.code, r.message),
        Ok(Err(NotTaken::Failed(e))) => {
            tracing::error!("backup into {to} failed: {e:#}");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::BackupFailed,
                format!("backup into {to} failed (nothing left there): {e:#}"),
            )
        }
        Err(join) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::BackupFailed,
            format!("backup into {to} panicked: {join}"),
        ),
    }
}

/// `monoseq backup --url U --to DIR`, through the client crate (one attempt: a backup is not
/// retried, since its directory exists after the first).
pub async fn run(args: BackupArgs) -> anyhow::Result<()> {
    if args.ca_cert.is_some() && !args.url.starts_with("https://") {
        bail!("--ca-cert is for an https:// --url");
    }
    let mut builder = monoseq_client::Client::builder([args.url.as_str()]);
    if let Some(token) = &args.token {
        builder = builder.token(token.token("--token (MONOSEQ_TOKEN)")?.secret());
    }
    if let Some(ca) = &args.ca_cert {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        builder = builder.ca_pem(pem);
    }
    let client = builder.build()?;
    let to = std::path::absolute(&args.to).unwrap_or(args.to.clone());
    let done = client
        .backup(&to.display().to_string())
        .await
        .map_err(|e| anyhow::anyhow!("the server refused the backup: {e}"))?;
    // Written with `?`: a closed pipe (`monoseq backup … | head -1`) ends the command quietly.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "backup of store {} taken into {}: {} keys, {} bytes, in {} ms; commands were not held \
         (fixing the instant took {} µs)",
        done.store_id, done.to, done.keys, done.bytes, done.took_ms, done.instant_us
    )?;
    writeln!(
        out,
        "restore: copy the directory into place, check it with `monoseq verify --data-dir DIR`, \
         then start it once with --marks-from <the lost machine's monoseq.marks or data \
         directory> or --skip-ahead N"
    )?;
    Ok(())
}

/// One line for a restored backup this start continued (what was retired), or for restore
/// flags given to a directory that is no restored backup.
pub fn log_restored(report: &monoseq_store::OpenReport) {
    if report.restore_unused {
        tracing::warn!(
            "--marks-from / --skip-ahead given, but the data directory is no restored backup \
             (no monoseq.backup stamp): nothing was retired; drop the flag"
        );
    }
    let Some(r) = &report.restored else {
        return;
    };
    let retired: Vec<String> = r
        .retired
        .iter()
        .map(|(p, end, m)| {
            format!(
                "partition {p}: PLog offsets {}..={}, WLog offsets up to {}, CRecord IDs up to {}, \
                 ORecord IDs up to {}",
                end + 1,
                m.plog,
                m.wlog,
                m.crecord,
                m.owrecord
            )
        })
        .collect();
    tracing::warn!(
        taken_at_ms = r.taken_at_ms,
        partitions_retired = r.retired.len(),
        "restored backup continued {}; retired, never to be handed out: {}; the backup stamp is \
         removed",
        r.how,
        if retired.is_empty() {
            "nothing (the store acknowledged nothing after the backup)".to_owned()
        } else {
            retired.join("; ")
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup root and a data directory under one temporary directory, both resolved.
    fn places() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let (root, data) = (base.join("root"), base.join("data"));
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&data).unwrap();
        (tmp, root, data)
    }

    fn code(root: &Path, data: &Path, to: &str) -> ErrorCode {
        match check_target(root, data, to) {
            Ok(t) => panic!("{to} was accepted as {}", t.display()),
            Err(r) => {
                assert!(r.message.contains(to), "{}", r.message);
                r.code
            }
        }
    }

    #[test]
    fn the_backup_route_is_administration() {
        assert!(BACKUP_PATH.starts_with(crate::auth::ADMIN_PATH_PREFIX));
    }

    #[test]
    fn a_new_directory_under_the_root_is_the_only_target_accepted() {
        let (_tmp, root, data) = places();
        let good = root.join("b1");
        assert_eq!(
            check_target(&root, &data, good.to_str().unwrap()),
            Ok(good.clone())
        );
        std::fs::create_dir(root.join("nightly")).unwrap();
        let deeper = root.join("nightly").join("b2");
        assert_eq!(
            check_target(&root, &data, deeper.to_str().unwrap()),
            Ok(deeper)
        );
        let r = check_target(&root, &data, "").unwrap_err();
        assert_eq!(r.code, ErrorCode::BackupPathEmpty);
        assert_eq!(code(&root, &data, "b1"), ErrorCode::BackupPathRelative);
        assert_eq!(code(&root, &data, "/"), ErrorCode::BackupPathNotNormal);
        let up = format!("{}/../escape", root.display());
        assert_eq!(code(&root, &data, &up), ErrorCode::BackupPathNotNormal);
        let outside = root.parent().unwrap().join("elsewhere");
        assert_eq!(
            code(&root, &data, outside.to_str().unwrap()),
            ErrorCode::BackupPathOutsideRoot
        );
        assert_eq!(
            code(&root, &data, "/no/such/place/b"),
            ErrorCode::BackupPathOutsideRoot
        );
        assert_eq!(
            code(&root, &data, root.to_str().unwrap()),
            ErrorCode::BackupPathOutsideRoot
        );
        let orphan = root.join("missing").join("b");
        assert_eq!(
            code(&root, &data, orphan.to_str().unwrap()),
            ErrorCode::BackupPathParentMissing
        );
        assert_eq!(
            code(&root, &data, root.join("nightly").to_str().unwrap()),
            ErrorCode::BackupPathExists
        );
        std::fs::write(root.join("file"), b"x").unwrap();
        assert_eq!(
            code(&root, &data, root.join("file").to_str().unwrap()),
            ErrorCode::BackupPathIsFile
        );
        let through_file = root.join("file").join("b");
        assert_eq!(
            code(&root, &data, through_file.to_str().unwrap()),
            ErrorCode::BackupPathParentMissing
        );
    }

    #[test]
    fn a_symbolic_link_that_leaves_the_root_is_refused() {
        let (_tmp, root, data) = places();
        let away = root.parent().unwrap().join("away");
        std::fs::create_dir(&away).unwrap();
        std::os::unix::fs::symlink(&away, root.join("link")).unwrap();
        let through = root.join("link").join("b");
        assert_eq!(
            code(&root, &data, through.to_str().unwrap()),
            ErrorCode::BackupPathLeavesRoot
        );
        // A link as the target itself exists already, wherever it points.
        std::os::unix::fs::symlink(away.join("new"), root.join("dangling")).unwrap();
        assert_eq!(
            code(&root, &data, root.join("dangling").to_str().unwrap()),
            ErrorCode::BackupPathExists
        );
        assert!(!away.join("new").exists());
        // A link inside the root to another place inside it is followed.
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("alias")).unwrap();
        let via_alias = root.join("alias").join("b");
        assert_eq!(
            check_target(&root, &data, via_alias.to_str().unwrap()),
            Ok(root.join("real").join("b"))
        );
    }

    #[test]
    fn the_data_directory_is_no_target_even_under_the_root() {
        let (_tmp, root, _) = places();
        let data = root.join("data");
        std::fs::create_dir(&data).unwrap();
        assert_eq!(
            code(&root, &data, data.join("b").to_str().unwrap()),
            ErrorCode::BackupPathInDataDir
        );
        assert_eq!(
            code(&root, &data, data.to_str().unwrap()),
            ErrorCode::BackupPathInDataDir
        );
    }

    #[test]
    fn a_claimed_directory_is_new_and_a_second_claim_is_refused() {
        let (_tmp, root, data) = places();
        let target = check_target(&root, &data, root.join("b").to_str().unwrap()).unwrap();
        claim(&root, &target).expect("created");
        assert!(target.is_dir());
        assert_eq!(
            claim(&root, &target).unwrap_err().code,
            ErrorCode::BackupPathExists
        );
    }

    fn serve_with_root(data: &Path, root: &Path) -> anyhow::Result<crate::config::Settings> {
        let mut args = crate::server::ServeArgs::default();
        args.storage.data_dir = Some(data.to_path_buf());
        args.backup.backup_root = Some(root.to_path_buf());
        args.resolve()
    }

    #[test]
    fn a_backup_root_that_is_no_usable_directory_refuses_the_start() {
        let (_tmp, root, data) = places();
        let settings = serve_with_root(&data, &root).expect("a directory outside the data");
        assert_eq!(settings.backup_root, Some(root.clone()));
        let err = |root: &Path| format!("{:#}", serve_with_root(&data, root).unwrap_err());
        let missing = root.join("missing");
        let e = err(&missing);
        assert!(
            e.contains(&format!("--backup-root {}", missing.display())) && e.contains("create"),
            "{e}"
        );
        std::fs::write(root.join("file"), b"x").unwrap();
        let e = err(&root.join("file"));
        assert!(e.contains("is not a directory"), "{e}");
        std::fs::create_dir(data.join("inside")).unwrap();
        let e = err(&data.join("inside"));
        assert!(e.contains("lies inside the data directory"), "{e}");
        let e = err(Path::new(""));
        assert!(e.contains("--backup-root is empty"), "{e}");
        let mut args = crate::server::ServeArgs::default();
        args.storage.storage = Some("postgres://u@127.0.0.1:5432/db".into());
        args.backup.backup_root = Some(root.clone());
        let e = format!("{:#}", args.resolve().unwrap_err());
        assert!(
            e.contains("PostgreSQL") && e.contains("pg_basebackup"),
            "{e}"
        );
        let unset = crate::server::ServeArgs::default()
            .resolve()
            .expect("defaults");
        assert_eq!(unset.backup_root, None);
    }
}
