//! Backups of the embedded store: `POST /v1/admin/backup` (behind a write token) copies the
//! running store into a new directory on the server's machine, and `monoseq backup` asks for
//! it; `--marks-from` and `--skip-ahead` continue a restored copy (`monoseq_store::backup`).
//!
//! The copy is consistent without holding commands: the marks are read first, then the
//! engine's instant is fixed by one snapshot. A mark is raised only after its group was written
//! to the engine, so every mark read is covered by the snapshot, and the snapshot is a state a
//! crash at that instant could have left (each batch whole), which the store recovers from.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clap::Args;
use monoseq_kv::EmbeddedStore;
use monoseq_store::{BackupStamp, Identity, Marks, Restore};
use serde::{Deserialize, Serialize};

use crate::base::error;

/// The route of a backup.
pub const BACKUP_PATH: &str = "/v1/admin/backup";

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
    /// The new directory to write the backup into, on the server's machine (absolute; it must
    /// not exist, its parent must).
    #[arg(long)]
    pub to: PathBuf,
    /// A write token of the server; prefer the environment variable.
    #[arg(long, env = "MONOSEQ_TOKEN", hide_env_values = true)]
    pub token: Option<crate::auth::TokenArg>,
    /// PEM file of the CA certificate(s) to trust for an https --url [default: the system's
    /// trusted CAs].
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
}

/// The body of `POST /v1/admin/backup`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRequest {
    /// The new directory, absolute, on the server's machine.
    pub to: PathBuf,
}

/// The answer of `POST /v1/admin/backup`.
#[derive(Debug, Deserialize, Serialize)]
pub struct BackupAnswer {
    /// Where the backup is.
    pub to: PathBuf,
    /// The store copied.
    pub store_id: String,
    /// When its instant was fixed (Unix milliseconds).
    pub taken_at_ms: u64,
    /// Each partition's acknowledged PLog offset at the backup.
    pub plog_marks: Vec<u64>,
    /// Keys and bytes copied.
    pub keys: u64,
    pub bytes: u64,
    /// How long fixing the instant took (the only step on the writers' path; no command waits
    /// for the copy), microseconds.
    pub instant_us: u64,
    /// How long the whole backup took, milliseconds.
    pub took_ms: u64,
}

/// What a backup needs of the running server.
pub struct Backups {
    kv: Arc<EmbeddedStore>,
    marks: Arc<Marks>,
    identity: Identity,
    data_dir: PathBuf,
    /// One backup at a time.
    running: tokio::sync::Mutex<()>,
}

impl Backups {
    /// The backups of an embedded store; `None` for PostgreSQL (its own tools back it up).
    pub fn new(
        settings: &crate::config::Settings,
        opened: &crate::config::Opened,
    ) -> Option<Backups> {
        Some(Backups {
            kv: Arc::clone(opened.embedded.as_ref()?),
            marks: Arc::clone(opened.marks.as_ref()?),
            identity: opened.identity.clone(),
            data_dir: settings.data_dir.clone(),
            running: tokio::sync::Mutex::new(()),
        })
    }

    /// `POST /v1/admin/backup`, behind the token check of `auth` (a write token).
    pub fn router(backups: Option<Backups>, auth: Arc<crate::auth::Auth>) -> Router {
        Router::new()
            .route(BACKUP_PATH, post(take))
            .with_state(backups.map(Arc::new))
            .layer(axum::middleware::from_fn_with_state(
                auth,
                crate::auth::require_token,
            ))
    }

    /// Copies the store into `to`: the stamp first (so an interrupted copy is never taken for
    /// a whole store), then the engine at one instant, its identity, and the marks read just
    /// before that instant.
    fn take(&self, to: &Path) -> anyhow::Result<BackupAnswer> {
        let started = Instant::now();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(to)
            .with_context(|| format!("creating {}", to.display()))?;
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
            let stats = self.kv.copy_to(to).context("copying the engine")?;
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
        Ok(BackupAnswer {
            to: to.to_path_buf(),
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

/// `POST /v1/admin/backup`.
async fn take(
    State(backups): State<Option<Arc<Backups>>>,
    body: Result<axum::Json<BackupRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(backups) = backups else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "this server runs on PostgreSQL: back the database up with its own tools \
             (pg_basebackup, point-in-time recovery; see docs/backups.md)",
        );
    };
    let to = match body {
        Ok(axum::Json(r)) => r.to,
        Err(e) => return error(StatusCode::BAD_REQUEST, "malformed_json", e.body_text()),
    };
    if !to.is_absolute() || to.starts_with(&backups.data_dir) {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!(
                "the backup directory must be an absolute path outside the data directory {}",
                backups.data_dir.display()
            ),
        );
    }
    let Ok(_one) = backups.running.try_lock() else {
        return error(
            StatusCode::CONFLICT,
            "backup_running",
            "a backup is being taken; wait for it to end",
        );
    };
    let taking = Arc::clone(&backups);
    let target = to.clone();
    match tokio::task::spawn_blocking(move || taking.take(&target)).await {
        Ok(Ok(answer)) => {
            tracing::info!(
                to = %answer.to.display(),
                keys = answer.keys,
                bytes = answer.bytes,
                instant_us = answer.instant_us,
                took_ms = answer.took_ms,
                "backup taken: commands were not held; fixing its instant took {} µs",
                answer.instant_us
            );
            axum::Json(answer).into_response()
        }
        Ok(Err(e)) => {
            tracing::error!("backup into {} failed: {e:#}", to.display());
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "backup_failed",
                format!(
                    "backup into {} failed (nothing left there): {e:#}",
                    to.display()
                ),
            )
        }
        Err(join) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "backup_failed",
            format!("backup into {} panicked: {join}", to.display()),
        ),
    }
}

/// `monoseq backup --url U --to DIR`.
pub async fn run(args: BackupArgs) -> anyhow::Result<()> {
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(3600));
    if args.url.starts_with("https://") {
        let tls = crate::tls::client_config(args.ca_cert.as_deref())?;
        client = client.tls_backend_preconfigured(Arc::unwrap_or_clone(tls));
    }
    let target = format!("{}{BACKUP_PATH}", args.url.trim_end_matches('/'));
    let mut request = client.build()?.post(&target).json(&BackupRequest {
        to: std::path::absolute(&args.to).unwrap_or(args.to.clone()),
    });
    if let Some(token) = &args.token {
        let authorization = token.token("--token (MONOSEQ_TOKEN)")?.authorization();
        request = request.header(reqwest::header::AUTHORIZATION, authorization);
    }
    let answer = request
        .send()
        .await
        .with_context(|| format!("asking {target}"))?;
    let status = answer.status();
    let body = answer.text().await.unwrap_or_default();
    if !status.is_success() {
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or(body);
        anyhow::bail!("the server refused the backup ({status}): {message}");
    }
    let done: BackupAnswer =
        serde_json::from_str(&body).with_context(|| format!("reading the answer of {target}"))?;
    // Written with `?`: a closed pipe (`monoseq backup … | head -1`) ends the command quietly.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "backup of store {} taken into {}: {} keys, {} bytes, in {} ms; commands were not held \
         (fixing the instant took {} µs)",
        done.store_id,
        done.to.display(),
        done.keys,
        done.bytes,
        done.took_ms,
        done.instant_us
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
