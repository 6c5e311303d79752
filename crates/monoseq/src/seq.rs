//! `monoseq seq …`: named sequences from the command line, on the local data directory (server
//! stopped), on an S3-compatible bucket, or through a running server (`--url`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use monoseq_named::cli::{Command, Target, USAGE, run};
use monoseq_named::{Client, KvBackend, S3Backend, S3Config, Sequences};

use crate::config::{DATA_DIR_DEFAULT, open_postgres, open_store};

/// Where `monoseq seq` works.
#[derive(Debug, Clone, Args)]
pub struct SeqArgs {
    /// A running server, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "MONOSEQ_URL", conflicts_with_all = ["data_dir", "s3_bucket", "storage"])]
    pub url: Option<String>,
    /// A PostgreSQL database, postgres://user:password@host:port/database.
    #[arg(long, env = "MONOSEQ_STORAGE", conflicts_with_all = ["data_dir", "s3_bucket"])]
    pub storage: Option<String>,
    /// Data directory of the embedded store [default: ./data].
    #[arg(long, env = "MONOSEQ_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// An S3 bucket (credentials from the AWS environment variables).
    #[arg(long, env = "MONOSEQ_S3_BUCKET")]
    pub s3_bucket: Option<String>,
    /// The S3-compatible endpoint of the bucket, e.g. http://127.0.0.1:5000.
    #[arg(long, env = "MONOSEQ_S3_ENDPOINT", requires = "s3_bucket")]
    pub s3_endpoint: Option<String>,
    /// The operation and its arguments: next ADDRESS [--initial N] [--increment N] …
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub words: Vec<String>,
}

/// Runs the command and prints its result; an error exits non-zero with its code.
pub async fn main(args: SeqArgs) -> anyhow::Result<()> {
    if matches!(
        args.words.first().map(String::as_str),
        Some("help" | "--help" | "-h")
    ) {
        println!("{USAGE}");
        return Ok(());
    }
    let command = Command::parse(&args.words).map_err(|e| anyhow::anyhow!("{e}\n\n{USAGE}"))?;
    let out = if let Some(url) = &args.url {
        let client = Client::new(url).context("connecting to the server")?;
        run(&command, Target::Remote(&client)).await
    } else if let Some(storage) = args.storage.as_deref().filter(|s| *s != "embedded") {
        let kv = open_postgres(storage)?;
        let sequences = Sequences::new(KvBackend::new(kv));
        run(&command, Target::Local(&sequences)).await
    } else if let Some(bucket) = &args.s3_bucket {
        let mut config = S3Config::new(bucket);
        if let Some(endpoint) = &args.s3_endpoint {
            config = config.endpoint(endpoint);
        }
        let sequences = Sequences::new(S3Backend::new(&config)?);
        run(&command, Target::Local(&sequences)).await
    } else {
        let dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DATA_DIR_DEFAULT));
        let sequences = Sequences::new(KvBackend::new(open_store(&dir)?));
        run(&command, Target::Local(&sequences)).await
    };
    match out {
        Ok(text) => {
            println!("{text}");
            Ok(())
        }
        Err(e) => Err(anyhow::anyhow!("{} ({})", e, e.code())),
    }
}
