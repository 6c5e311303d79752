//! The `monoseq` binary: `serve` runs the HTTP server on the embedded store; `inspect`,
//! `verify` and `bench` are the operator commands.

mod auth;
mod bench;
mod cluster;
mod config;
mod forward;
mod json;
mod ops;
mod seq;
mod server;
mod tls;

use clap::{Parser, Subcommand};

/// mimalloc: the server allocates per command from many threads; measured faster than the
/// system allocator under `monoseq bench`. Built with `no_thp`: it does not ask for
/// transparent huge pages, whose 2 MiB zeroing after each purge cost a quarter of the CPU
/// (see DESIGN.md, "Why mimalloc without transparent huge pages?").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// monoseq: monotonic sequence numbers for event-sourced, partitioned backends.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Log format on standard error: text or json. What is logged is chosen with `RUST_LOG`
    /// (default: info for `serve`, warn otherwise).
    #[arg(
        long,
        global = true,
        env = "MONOSEQ_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs to standard error, filtered by `RUST_LOG` (or `default` when unset).
fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the HTTP server (commands, events, records, health, metrics).
    Serve {
        #[command(flatten)]
        settings: config::SettingsArgs,
        #[command(flatten)]
        cluster: cluster::ClusterArgs,
        #[command(flatten)]
        security: auth::SecurityArgs,
    },
    /// Show each partition's checkpoint against its PLog end (server stopped).
    Inspect {
        #[command(flatten)]
        settings: config::SettingsArgs,
        /// Also scan whole PLogs to count workspaces.
        #[arg(long)]
        full: bool,
    },
    /// Read a copy of the data directory whole (PLogs, WLogs, records, stored numbers,
    /// identity and marks) and report every problem; changes nothing in the directory. Exits
    /// non-zero on a problem (server stopped).
    Verify {
        #[command(flatten)]
        settings: config::SettingsArgs,
        /// Problems printed; the rest are counted.
        #[arg(long, default_value_t = 20)]
        show: usize,
    },
    /// Named sequences: next, increment, get, data, exists, reset, set, delete (run
    /// `monoseq seq help` for the usage).
    Seq {
        #[command(flatten)]
        args: seq::SeqArgs,
    },
    /// Several nodes on one database: `monoseq cluster status --url U` shows the nodes, their
    /// partitions, epochs and lease ages.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCmd,
    },
    /// Generate load against a server (--url) or in-process, and print throughput and latency.
    Bench {
        #[command(flatten)]
        settings: config::SettingsArgs,
        #[command(flatten)]
        bench: bench::BenchArgs,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Cmd::Serve { .. });
    init_logging(cli.log_format, if serving { "info" } else { "warn" });
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of our output went away (`monoseq inspect | head`): nothing to report.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) if serving => {
            tracing::error!("refusing to start: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("monoseq: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// An error with its causes, each said once: many errors already name their cause in their
/// own text, so a cause whose text is already there is left out.
fn describe(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("monoseq")
        .build()?;
    match cli.command {
        Cmd::Serve {
            settings,
            security,
            cluster,
        } => {
            let settings = settings.resolve()?;
            let security = security.resolve(&settings.security, settings.listen)?;
            runtime.block_on(server::serve(settings, security, cluster))
        }
        Cmd::Inspect { settings, full } => ops::inspect(&settings.resolve()?, full),
        Cmd::Verify { settings, show } => ops::verify(&settings.resolve()?, show),
        Cmd::Seq { args } => runtime.block_on(seq::main(args)),
        Cmd::Cluster { command } => runtime.block_on(cluster::run_command(command)),
        Cmd::Bench { settings, bench } => runtime.block_on(bench::run(bench, settings.resolve()?)),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn an_error_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("inner failed")]
        struct Inner;
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Outer(#[source] Inner);
        let e = anyhow::Error::new(Outer(Inner)).context("opening");
        assert_eq!(super::describe(&e), "opening: outer: inner failed");
    }

    #[test]
    fn every_command_line_is_well_formed() {
        // Clap's own checks: unique argument names, valid defaults, no conflicting flags.
        super::Cli::command().debug_assert();
    }
}
