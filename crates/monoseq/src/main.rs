//! The `monoseq` binary: `serve` runs the HTTP server on the embedded store; `inspect`,
//! `verify`, `bench` and `bench-consume` are the operator commands; `seq` runs named-sequence operations.
//! Owns the command line (each command flattens only the setting groups it uses) and the exit
//! codes.

mod answer_log;
mod auth;
mod backup;
mod base;
mod bench;
mod bench_consume;
mod cluster;
mod config;
mod edge;
mod forward;
mod json;
mod ops;
mod peers;
mod query;
mod seq;
mod seq_command;
mod server;
mod storage;
mod tail;
mod tls;
mod wire;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc: the server allocates per command from many threads; measured faster than the
/// system allocator under `monoseq bench`. Built with `no_thp`: it does not ask for
/// transparent huge pages, whose 2 MiB zeroing after each purge cost a quarter of the CPU
/// (see DESIGN.md, "Why mimalloc without huge pages, and one codegen unit?").
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

/// The log filter of `serve` when `RUST_LOG` is unset: our own lines from `info`, the storage
/// engines' (which announce every recovered tree at `info`) from `warn`.
const SERVE_LOG_DEFAULT: &str = "info,fjall=warn,lsm_tree=warn";

/// Logs to standard error, filtered by `RUST_LOG` (or `default` when unset). Records of the
/// `log` crate (fjall's, among others: a failed flush or compaction, a crashed storage worker)
/// are logged the same way, so no storage error goes unseen.
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

// `serve` has many flags; the command line is parsed once, so its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the HTTP server (commands, events, records, health, metrics).
    Serve {
        #[command(flatten)]
        args: server::ServeArgs,
    },
    /// Show each partition's checkpoint against its PLog end (server stopped).
    Inspect {
        #[command(flatten)]
        storage: config::StorageArgs,
        #[command(flatten)]
        store: config::StoreArgs,
        /// Also scan whole PLogs to count workspaces.
        #[arg(long)]
        full: bool,
    },
    /// Read a copy of the data directory whole (PLogs, WLogs, records, stored numbers,
    /// identity and marks) and report every problem; changes nothing in the directory. Exits
    /// non-zero on a problem (server stopped).
    Verify {
        #[command(flatten)]
        storage: config::StorageArgs,
        #[command(flatten)]
        store: config::StoreArgs,
        /// Problems printed; the rest are counted.
        #[arg(long, default_value_t = ops::VERIFY_SHOWN_DEFAULT)]
        show: usize,
    },
    /// Named sequences: next, increment, reserve, get, data, exists, reset, delete, on a data
    /// directory, a database, a bucket or through a server (`monoseq seq help`).
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
    /// Back up a running server's embedded store into a new directory on its machine,
    /// under its --backup-root, without holding its commands (`POST /v1/admin/backup`, an
    /// admin token).
    Backup {
        #[command(flatten)]
        args: backup::BackupArgs,
    },
    /// Follow a partition and print each event as one JSON line (a console consumer):
    /// `monoseq tail --url U --partition P [--from N] [--consumer NAME] [--max-events N]`, or
    /// as a consumer group member: `monoseq tail --url U --group G --member M`.
    Tail {
        #[command(flatten)]
        args: tail::TailArgs,
    },
    /// Generate load against a server (--url) or in-process, and print throughput and latency.
    Bench {
        #[command(flatten)]
        storage: config::StorageArgs,
        #[command(flatten)]
        store: config::StoreArgs,
        #[command(flatten)]
        processor: config::ProcessorArgs,
        #[command(flatten)]
        bench: bench::BenchArgs,
    },
    /// Generate load on a server's consumer side (--url): fill a partition, read it from the
    /// start in pages, or follow it live while commands are written, and print the figures.
    BenchConsume {
        #[command(flatten)]
        args: bench_consume::ConsumeBenchArgs,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Cmd::Seq { .. })
        && let Err(message) = seq::reject_repeated(std::env::args_os())
    {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
    let serving = matches!(cli.command, Cmd::Serve { .. });
    init_logging(
        cli.log_format,
        if serving { SERVE_LOG_DEFAULT } else { "warn" },
    );
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of our output went away (`monoseq inspect | head`): nothing to report.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) if serving => {
            tracing::error!("refusing to start: {e:#}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("monoseq: {e:#}");
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

/// The settings of a tool that reads the store (`inspect`, `verify`).
fn tool_settings(
    storage: &config::StorageArgs,
    store: &config::StoreArgs,
) -> anyhow::Result<config::Settings> {
    config::resolve(storage, store, &Default::default(), &Default::default())
}

/// How long the process waits, once a command is done, for work left on the runtime's
/// blocking threads: a storage engine stuck in a flush it can no longer finish (its data
/// directory gone, its disk failed) must not keep a server that said "stopped" from exiting.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn run(cli: Cli) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("monoseq")
        .build()?;
    let done = command(cli, &runtime);
    runtime.shutdown_timeout(EXIT_WAIT);
    done
}

fn command(cli: Cli, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Serve { args } => {
            let settings = args.resolve()?;
            let security = args.security.resolve(&settings.security, settings.listen)?;
            runtime.block_on(server::serve(settings, security, args.cluster))
        }
        Cmd::Cluster { command } => runtime.block_on(cluster::run_command(command)),
        Cmd::Inspect {
            storage,
            store,
            full,
        } => ops::inspect(&tool_settings(&storage, &store)?, full),
        Cmd::Verify {
            storage,
            store,
            show,
        } => ops::verify(&tool_settings(&storage, &store)?, show),
        Cmd::Seq { args } => runtime.block_on(seq::main(args)),
        Cmd::Backup { args } => runtime.block_on(backup::run(args)),
        Cmd::Tail { args } => runtime.block_on(tail::run(args)),
        Cmd::Bench {
            storage,
            store,
            processor,
            bench,
        } => {
            let settings = config::resolve(&storage, &store, &processor, &Default::default())?;
            runtime.block_on(bench::run(bench, settings))
        }
        Cmd::BenchConsume { args } => runtime.block_on(bench_consume::run(args)),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The help text of `monoseq <command>`.
    fn help(command: &str) -> String {
        let mut cli = super::Cli::command();
        cli.find_subcommand_mut(command)
            .expect("the command exists")
            .render_long_help()
            .to_string()
    }

    #[test]
    fn each_command_lists_only_its_own_flags() {
        let verify = help("verify");
        assert!(!verify.contains("--listen"), "{verify}");
        assert!(!verify.contains("--group-commands-max"), "{verify}");
        let inspect = help("inspect");
        assert!(!inspect.contains("--listen"), "{inspect}");
        let bench = help("bench");
        assert!(!bench.contains("--accept-loss"), "{bench}");
        assert!(help("serve").contains("--listen"));
    }

    #[test]
    fn help_defaults_come_from_the_constants() {
        let serve = help("serve");
        for default in [
            format!("[default: {}]", crate::config::LISTEN_DEFAULT),
            format!("[default: {}]", monoseq_cp::GROUP_COMMANDS_MAX_DEFAULT),
            format!("[default: {}]", monoseq_cp::FLUSH_DELAY_DEFAULT.as_millis()),
            format!("or {} for a new one", crate::config::PARTITIONS_DEFAULT),
        ] {
            assert!(serve.contains(&default), "{default} missing from: {serve}");
        }
        assert!(
            help("verify").contains(&format!("[default: {}]", crate::ops::VERIFY_SHOWN_DEFAULT))
        );
        assert!(help("seq").contains(&format!(
            "[default: {}]",
            crate::seq::SEQ_TIMEOUT_DEFAULT_MS
        )));
    }

    #[test]
    fn serve_has_no_switch_that_drops_a_protection() {
        use clap::Parser;
        for unsafe_flag in ["--no-marks", "--no-fencing"] {
            let parsed = super::Cli::try_parse_from(["monoseq", "serve", unsafe_flag]);
            assert!(parsed.is_err(), "serve takes {unsafe_flag}");
        }
        // The in-process bench, which serves nobody, measures what the marks cost.
        assert!(super::Cli::try_parse_from(["monoseq", "bench", "--no-marks"]).is_ok());
        let against_a_server = [
            "monoseq",
            "bench",
            "--no-marks",
            "--url",
            "http://127.0.0.1:1",
        ];
        assert!(super::Cli::try_parse_from(against_a_server).is_err());
        // Every hidden flag of serve was audited against the invariants (the marks cycle's
        // gather bound only sets how long a cycle waits for other groups): a new one is too.
        let mut cli = super::Cli::command();
        let serve = cli.find_subcommand_mut("serve").expect("serve");
        let hidden: Vec<String> = serve
            .get_arguments()
            .filter(|a| a.is_hide_set())
            .map(|a| a.get_id().to_string())
            .collect();
        assert_eq!(hidden, ["marks_gather_us"]);
    }

    #[test]
    fn every_command_line_is_well_formed() {
        // Clap's own checks: unique argument names, valid defaults, no conflicting flags.
        super::Cli::command().debug_assert();
    }
}
