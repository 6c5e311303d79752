//! `monoseq seq …`: named sequences from the command line. Owns the command line of `seq` (one
//! clap subcommand per operation, the backend options accepted anywhere on the line) and the
//! choice of backend: a running server (`--url`), a PostgreSQL database (`--storage`), an
//! S3-compatible bucket (`--s3-bucket`), or the embedded store's data directory (the default,
//! for one process at a time: a directory held by another process is waited for up to
//! `--timeout-ms`). The operations, their arguments included, are in `seq_command.rs`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use monoseq_client::{SequencesClient, SequencesError};
use monoseq_kv::{EmbeddedStore, OpenError};
use monoseq_named::{KvBackend, Sequences, TIMEOUT_DEFAULT};

use crate::config::DATA_DIR_DEFAULT;
use crate::seq_command::{CommandError, Operation, Target, run};
use crate::storage::{open_postgres, open_store};

/// Default of `--timeout-ms`: the library's own operation timeout.
pub const SEQ_TIMEOUT_DEFAULT_MS: u64 = TIMEOUT_DEFAULT.as_millis() as u64;

/// How often a locked data directory is tried again while `seq` waits for it.
const LOCK_RETRY_INTERVAL: Duration = Duration::from_millis(50);

/// `monoseq seq`: the backend options (accepted before or after the operation) and the
/// operation.
#[derive(Debug, Clone, Args)]
#[command(after_help = format!(
    "ADDRESS is [SCOPE/]NAME: invoice, orders/invoice (resource orders), plugin=audit/events, \
     resource=orders/plugin=backup/run, prefix=my-app/counter.\n\
     Without --url, --storage or --s3-bucket, seq opens the data directory (--data-dir, default \
     {DATA_DIR_DEFAULT}), which one process at a time may hold; with a server running on it, \
     use --url."
))]
pub struct SeqArgs {
    #[command(flatten)]
    pub backend: SeqBackend,
    /// Longest wait, in milliseconds, for the operation (retries of a contended write) and for
    /// a data directory held by another process.
    #[arg(long, global = true, default_value_t = SEQ_TIMEOUT_DEFAULT_MS)]
    pub timeout_ms: u64,
    #[command(subcommand)]
    pub operation: Operation,
}

/// Where `monoseq seq` works: at most one of a server, a database, a bucket or a data
/// directory.
#[derive(Debug, Clone, Args)]
pub struct SeqBackend {
    /// A running server, e.g. http://127.0.0.1:8080.
    #[arg(long, global = true, env = "MONOSEQ_URL",
          conflicts_with_all = ["data_dir", "s3_bucket", "storage"])]
    pub url: Option<String>,
    /// A bearer token for a server (--url) that requires one; prefer the environment variable,
    /// which other users cannot see in the process list.
    #[arg(long, global = true, env = "MONOSEQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PostgreSQL database, postgres://user:password@host:port/database (`embedded` means
    /// the data directory).
    #[arg(
        long,
        global = true,
        env = "MONOSEQ_STORAGE",
        conflicts_with = "s3_bucket"
    )]
    pub storage: Option<String>,
    #[arg(long, global = true, env = "MONOSEQ_DATA_DIR", conflicts_with = "s3_bucket",
          help = format!("Data directory of the embedded store [default: {DATA_DIR_DEFAULT}]"))]
    pub data_dir: Option<PathBuf>,
    /// An S3 bucket (credentials from the AWS environment variables).
    #[arg(long, global = true, env = "MONOSEQ_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// The S3-compatible endpoint of the bucket, e.g. http://127.0.0.1:5000.
    #[arg(
        long,
        global = true,
        env = "MONOSEQ_S3_ENDPOINT",
        requires = "s3_bucket"
    )]
    pub s3_endpoint: Option<String>,
}

/// The options of `seq` accepted on both sides of the operation.
const GLOBAL_FLAGS: [&str; 6] = [
    "--url",
    "--storage",
    "--data-dir",
    "--s3-bucket",
    "--s3-endpoint",
    "--timeout-ms",
];

/// An option of `seq` given more than once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the argument '{0}' cannot be used multiple times")]
pub struct RepeatedFlag(pub &'static str);

/// Refuses an option of `seq` given both before and after the operation (`--data-dir a next x
/// --data-dir b`), which clap would let the second override: on one side clap itself refuses
/// a repetition.
///
/// # Errors
///
/// A clap error naming the option, to print and exit with as clap does.
pub fn reject_repeated(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Result<(), RepeatedFlag> {
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    for flag in GLOBAL_FLAGS {
        let given = args
            .iter()
            .filter(|a| *a == flag || a.starts_with(&format!("{flag}=")))
            .count();
        if given > 1 {
            return Err(RepeatedFlag(flag));
        }
    }
    Ok(())
}

/// Runs the operation and prints its result; an error exits non-zero naming its code once.
pub async fn main(args: SeqArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_millis(args.timeout_ms);
    let target = open_target(&args.backend, timeout).await?;
    match run(&args.operation, &target, timeout).await {
        Ok(text) => {
            println!("{text}");
            Ok(())
        }
        Err(e) => {
            // A server's refusal already names its code in its text.
            if matches!(e, CommandError::Client(SequencesError::Api { .. })) {
                Err(anyhow::anyhow!(e))
            } else {
                Err(anyhow::anyhow!("{e} ({})", e.code()))
            }
        }
    }
}

/// Opens the backend the options name; with none named, the data directory, saying so on
/// standard error.
async fn open_target(backend: &SeqBackend, timeout: Duration) -> anyhow::Result<Target> {
    if let Some(url) = &backend.url {
        let client = match &backend.token {
            Some(token) => SequencesClient::with_token(url, token),
            None => SequencesClient::new(url),
        };
        return Ok(Target::Remote(client.context("connecting to the server")?));
    }
    if let Some(storage) = backend.storage.as_deref().filter(|s| *s != "embedded") {
        if backend.data_dir.is_some() {
            anyhow::bail!(
                "--data-dir is the embedded store's and --storage names a database: give one \
                 of them"
            );
        }
        let kv = open_postgres(storage)?;
        return Ok(Target::Local(Sequences::new(KvBackend::new(kv))));
    }
    if let Some(bucket) = &backend.s3_bucket {
        return Ok(Target::Local(open_s3(
            bucket,
            backend.s3_endpoint.as_deref(),
        )?));
    }
    let dir = match &backend.data_dir {
        Some(dir) => dir.clone(),
        None => {
            eprintln!(
                "monoseq seq: using the data directory {DATA_DIR_DEFAULT} (give --url, \
                 --storage, --s3-bucket or --data-dir to choose)"
            );
            PathBuf::from(DATA_DIR_DEFAULT)
        }
    };
    let store = open_waiting(&dir, timeout).await?;
    Ok(Target::Local(Sequences::new(KvBackend::new(store))))
}

/// Named sequences in an S3 bucket (credentials from the AWS environment variables).
#[cfg(feature = "s3")]
fn open_s3(bucket: &str, endpoint: Option<&str>) -> anyhow::Result<Sequences> {
    let mut config = monoseq_named::S3Config::new(bucket);
    if let Some(endpoint) = endpoint {
        config = config.endpoint(endpoint);
    }
    Ok(Sequences::new(monoseq_named::S3Backend::new(&config)?))
}

/// This build has no S3 support (feature `s3`).
#[cfg(not(feature = "s3"))]
fn open_s3(_bucket: &str, _endpoint: Option<&str>) -> anyhow::Result<Sequences> {
    anyhow::bail!(
        "this monoseq was built without S3 support; build it with the default features \
         (feature `s3`)"
    )
}

/// Opens the embedded store in `dir`, waiting up to `timeout` while another process holds it.
async fn open_waiting(
    dir: &std::path::Path,
    timeout: Duration,
) -> anyhow::Result<Arc<EmbeddedStore>> {
    let deadline = Instant::now() + timeout;
    loop {
        match open_store(dir) {
            Ok(store) => return Ok(store),
            Err(e) if is_locked(&e) && Instant::now() < deadline => {
                tokio::time::sleep(LOCK_RETRY_INTERVAL).await;
            }
            Err(e) if is_locked(&e) => anyhow::bail!(
                "the data directory {} is in use by another process (a running server?); use \
                 `--url` to go through it (waited {} ms, --timeout-ms)",
                dir.display(),
                timeout.as_millis()
            ),
            Err(e) => return Err(e),
        }
    }
}

fn is_locked(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<OpenError>(),
            Some(OpenError::Locked { .. })
        )
    })
}
