//! `monoseq bench`: a load generator. Against a running server over HTTP or HTTPS (`--url`,
//! with `--token` and `--ca-cert`) through the client crate `monoseq-client`, or in-process straight into the command processor on a
//! fresh embedded store. Prints the throughput and latency percentiles.
//!
//! In-process, `--no-marks` runs the command processor without high-water marks, to measure
//! what they cost; the bench serves nobody, so it is its own flag and `serve` has none (a
//! server keeps its marks, always).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use hdrhistogram::Histogram;
use monoseq_cp::CommandProcessor;
use monoseq_store::TrustLevel;
use monoseq_wire::{KindBody, NewArgBody, NewRecordBody, RecordUpdateBody};
use serde_json::{Map, Value};

use crate::config::Settings;
use crate::storage::open_storage;
use crate::wire::CommandBody;

/// Default of `--clients`.
pub const CLIENTS_DEFAULT: usize = 64;
/// Default of `--seconds`.
pub const SECONDS_DEFAULT: u64 = 10;
/// Default of `--workspaces`.
pub const WORKSPACES_DEFAULT: u64 = 1_000;

/// Load generator flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Server to load, e.g. http://127.0.0.1:8080 or https://…; without it the bench runs
    /// in-process.
    #[arg(long)]
    pub url: Option<String>,
    /// Bearer token sent with every command (a write token of the server); prefer the
    /// environment variable, which other users cannot see in the process list.
    #[arg(long, env = "MONOSEQ_TOKEN", hide_env_values = true)]
    pub token: Option<crate::auth::TokenArg>,
    /// PEM file of the CA certificate(s) to trust for an https --url [default: the system's
    /// trusted CAs].
    #[arg(long, requires = "url")]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Concurrent clients.
    #[arg(long, default_value_t = CLIENTS_DEFAULT)]
    pub clients: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = SECONDS_DEFAULT)]
    pub seconds: u64,
    /// Workspaces the commands spread over.
    #[arg(long, default_value_t = WORKSPACES_DEFAULT)]
    pub workspaces: u64,
    /// In-process only: data directory for the fresh store [default: a temporary directory].
    #[arg(long)]
    pub bench_dir: Option<std::path::PathBuf>,
    /// Send every command with its own `Idempotency-Key`, to measure what keys cost.
    #[arg(long)]
    pub idempotency_keys: bool,
    /// In-process only: send every command on the expected WLog offset of its workspace
    /// (`expected_wlog_offset`, as the clients last saw it), to measure what the condition
    /// costs. A command refused `wlog_conflict` (two clients on one workspace at once) is
    /// counted apart, as `conflicts`.
    #[arg(long, conflicts_with = "url")]
    pub expected_wlog_offset: bool,
    /// In-process only: every command updates a record of its workspace (one per workspace,
    /// created before the load) instead of creating one, to measure what an update costs.
    #[arg(long, conflicts_with = "url")]
    pub updates: bool,
    /// With --url: send the commands in batches of this many (`POST /v1/commands/batch`), each
    /// gathered from the commands of one partition owner, counting each command; latencies are
    /// per batch.
    #[arg(long, requires = "url", value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch: Option<u16>,
    /// In-process only: keep no high-water marks, to measure what they cost (a server always
    /// keeps them).
    #[arg(long, conflicts_with = "url")]
    pub no_marks: bool,
    /// With --url: commands per second to offer in all, spread evenly over the clients and
    /// over time (the clients' schedules staggered), each sending on a fixed schedule whether
    /// or not its earlier requests were answered (up to 64 in flight each; `held` counts the
    /// waits past that); latencies are then measured from when a request was due, so that a
    /// stall of the server counts in full. Without it each client sends its next request as
    /// soon as the last is answered.
    #[arg(long, requires = "url", value_parser = clap::value_parser!(u64).range(1..=RATE_MAX))]
    pub rate: Option<u64>,
}

/// The least HTTP status of a server error (5xx), counted apart.
const SERVER_ERROR_STATUS_MIN: u16 = 500;

/// Largest `--rate`, commands per second.
pub const RATE_MAX: u64 = 100_000_000;

/// Under `--rate`, the most requests one client has in flight. A paced client sends each
/// request when it is due, answered or not (an open loop, as a population of users sends), so
/// that its latency from the due time is the server's answer and not a queue inside the client
/// behind its own previous request; past this many it waits for an answer first (counted as
/// `held`), and that wait counts in the latency too.
pub const PACED_IN_FLIGHT_MAX: usize = 64;

/// The schedule of one client under `--rate`: a request every `clients × commands per
/// request ÷ rate` seconds, client `c` of `clients` starting `c ÷ clients` of a period after
/// the first, so that the clients' requests arrive evenly spread over each period and not all
/// at once (a burst of every client's request that the last one in it waits through). A
/// request that falls behind is sent at once (the schedule does not move), so the latency of
/// what was held up includes the hold-up.
struct Pace(Option<tokio::time::Interval>);

impl Pace {
    fn new(args: &BenchArgs, per_request: usize, client: u64) -> Pace {
        Pace(args.rate.map(|rate| {
            let clients = args.clients.max(1);
            let period = Duration::from_secs_f64((clients * per_request) as f64 / rate as f64)
                .max(Duration::from_micros(1));
            let offset = period.mul_f64((client % clients as u64) as f64 / clients as f64);
            let start = tokio::time::Instant::now() + offset;
            let mut interval = tokio::time::interval_at(start, period);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            interval
        }))
    }

    fn paced(&self) -> bool {
        self.0.is_some()
    }

    /// Waits until the next request is due and answers when it was due (now, unpaced).
    async fn due(&mut self) -> Instant {
        match &mut self.0 {
            Some(interval) => interval.tick().await.into_std(),
            None => Instant::now(),
        }
    }
}

/// The command every client sends: one CDoc, an argument ODoc referring to it.
fn command(ws: u64) -> CommandBody {
    let field = |name: &str, value: Value| Map::from_iter([(name.to_owned(), value)]);
    let mut command = CommandBody::new(ws, 1, "bench.Create");
    let mut doc = NewRecordBody::new(1, KindBody::CDoc, "bench.Doc");
    doc.fields = field("n", ws.into());
    command.create.push(doc);
    command.argument = Some(NewArgBody {
        raw_id: 2,
        name: "bench.Arg".to_owned(),
        fields: field("doc", Value::Object(field("$raw", 1.into()))),
        children: Vec::new(),
    });
    command
}

/// With `--updates`, the command every client sends: the record `id` of `ws` gets field `n`
/// set to `n`; the argument ODoc names the record, as the creating command's refers to it.
fn update_command(ws: u64, id: u64, n: u64) -> CommandBody {
    let field = |name: &str, value: Value| Map::from_iter([(name.to_owned(), value)]);
    let mut command = CommandBody::new(ws, 1, "bench.Update");
    command.update.push(RecordUpdateBody {
        id,
        fields: field("n", n.into()),
    });
    command.argument = Some(NewArgBody {
        raw_id: 1,
        name: "bench.Arg".to_owned(),
        fields: field("doc", id.into()),
        children: Vec::new(),
    });
    command
}

/// Commands in flight at once while `--updates` creates its records.
const SETUP_COMMANDS_IN_FLIGHT: usize = 1_024;

/// With `--updates`: creates one record per workspace before the load (the command of
/// [`command`]); their IDs, by workspace (workspace 1 first).
async fn create_records<S: monoseq_kv::KvStore + Clone + Send + Sync + 'static>(
    cp: &CommandProcessor<S>,
    workspaces: u64,
) -> anyhow::Result<Arc<[u64]>> {
    let create = |ws: u64| async move {
        loop {
            match cp.submit(crate::wire::command(command(ws))).await {
                Ok(out) => return Ok(out.ids[&1]),
                Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(1)).await,
                Err(e) => return Err(e),
            }
        }
    };
    let mut ids = Vec::with_capacity(usize::try_from(workspaces).unwrap_or(0));
    let all: Vec<u64> = (1..=workspaces).collect();
    for chunk in all.chunks(SETUP_COMMANDS_IN_FLIGHT) {
        for id in futures_util::future::join_all(chunk.iter().map(|&ws| create(ws))).await {
            ids.push(id.context("creating the records that --updates updates")?);
        }
    }
    Ok(ids.into())
}

/// What the clients measured.
struct Tally {
    ok: u64,
    busy: u64,
    failed: u64,
    /// Refused `wlog_conflict` (`--expected-wlog-offset`).
    conflicts: u64,
    /// Commands answered with a 5xx status (busy ones included).
    server_errors: u64,
    /// Paced requests that waited for an answer because [`PACED_IN_FLIGHT_MAX`] were out.
    held: u64,
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            ok: 0,
            busy: 0,
            failed: 0,
            conflicts: 0,
            server_errors: 0,
            held: 0,
            latency_us: Histogram::new_with_bounds(1, crate::bench_consume::LATENCY_US_MAX, 3)
                .expect("valid bounds"),
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.ok += other.ok;
        self.busy += other.busy;
        self.failed += other.failed;
        self.conflicts += other.conflicts;
        self.server_errors += other.server_errors;
        self.held += other.held;
        let _ = self.latency_us.add(&other.latency_us);
    }

    /// Counts one command's answer, and its latency from `began` when it succeeded; a busy
    /// answer (503) apart from a failure.
    fn count_one(&mut self, answer: Result<(), monoseq_client::ClientError>, began: Instant) {
        match answer {
            Ok(()) => {
                self.ok += 1;
                let _ = self.latency_us.record(began.elapsed().as_micros() as u64);
            }
            Err(e) => self.count_refused(e.status()),
        }
    }

    /// Counts a command answered with an error of `status`: busy (503) or failed.
    fn count_refused(&mut self, status: Option<u16>) {
        self.count_server_error(status);
        if status == Some(503) {
            self.busy += 1;
        } else {
            self.failed += 1;
        }
    }

    /// Counts a command answered with `status`, when it is a 5xx.
    fn count_server_error(&mut self, status: Option<u16>) {
        if status.is_some_and(|s| s >= SERVER_ERROR_STATUS_MIN) {
            self.server_errors += 1;
        }
    }
}

/// Runs the bench and prints one line of results.
pub async fn run(args: BenchArgs, mut settings: Settings) -> anyhow::Result<()> {
    if args.clients == 0 || args.workspaces == 0 {
        bail!("--clients and --workspaces must be at least 1");
    }
    let client = match &args.url {
        Some(url) => {
            let client = http_client(url, &args)?;
            print_server_info(&client, url).await?;
            Some(client)
        }
        None => None,
    };
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let (mode, tally, elapsed) = match &client {
        Some(client) => {
            let began = Instant::now();
            let t = match args.batch {
                Some(size) => http_batch_load(client, &args, deadline, usize::from(size)).await?,
                None => http_load(client, &args, deadline).await?,
            };
            ("http", t, began.elapsed())
        }
        None => {
            let (t, elapsed) = in_process(&args, &mut settings, deadline).await?;
            ("in-process", t, elapsed)
        }
    };
    print_results(mode, &args, &settings, &tally, elapsed);
    Ok(())
}

/// The in-process load: a command processor on a data directory (`--bench-dir`, or else a
/// temporary one) until `deadline`; answers the tally and how long the load ran.
async fn in_process(
    args: &BenchArgs,
    settings: &mut Settings,
    deadline: Instant,
) -> anyhow::Result<(Tally, Duration)> {
    let temp;
    let dir = match &args.bench_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    settings.data_dir = dir;
    let opened = open_storage(settings)?;
    let mut config = settings.cp_config();
    if !args.no_marks {
        config.marks = opened.marks.clone();
        crate::storage::set_marks_gather(config.marks.as_deref(), settings.marks_gather_us);
    }
    let cp = CommandProcessor::start(opened.event_store(settings.trust), config)?;
    while !cp.ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let records = if args.updates {
        Some(create_records(&cp, args.workspaces).await?)
    } else {
        None
    };
    let began = Instant::now();
    let t = in_process_load(&cp, args, records, deadline).await;
    let elapsed = began.elapsed();
    cp.shutdown(settings.shutdown_timeout).await;
    Ok((t, elapsed))
}

/// The one line of results.
fn print_results(
    mode: &str,
    args: &BenchArgs,
    settings: &Settings,
    tally: &Tally,
    elapsed: Duration,
) {
    let trust = match (&args.url, settings.trust) {
        (Some(_), _) => "server's",
        (None, TrustLevel::Level0) => "0",
        (None, TrustLevel::Level1) => "1",
        (None, _) => "2",
    };
    let h = &tally.latency_us;
    let mut conflicts = if args.expected_wlog_offset {
        format!(" conflicts={}", tally.conflicts)
    } else {
        String::new()
    };
    if args.rate.is_some() {
        conflicts.push_str(&format!(" held={}", tally.held));
    }
    let mix = if args.updates { "updates" } else { "creates" };
    println!(
        "bench: mode={mode} trust={trust} mix={mix} partitions={} clients={} ok={} busy={} \
         failed={} 5xx={} throughput={:.0} cmd/s p50={}us p90={}us p99={}us p999={}us max={}us\
         {conflicts}",
        if args.url.is_some() {
            "server's".to_owned()
        } else {
            settings.partitions.to_string()
        },
        args.clients,
        tally.ok,
        tally.busy,
        tally.failed,
        tally.server_errors,
        tally.ok as f64 / elapsed.as_secs_f64(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.9),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
    );
}

/// The body of a client's `n`th command, on workspace `ws`: with `records` (`--updates`, by
/// workspace) an update of the workspace's record, else `template` (a create) on `ws`.
fn body(template: &CommandBody, records: Option<&[u64]>, ws: u64, n: u64) -> CommandBody {
    match records {
        Some(ids) => update_command(ws, ids[(ws - 1) as usize], n),
        None => CommandBody {
            ws,
            ..template.clone()
        },
    }
}

/// The in-process load until `deadline`: with `records` (`--updates`, by workspace) every
/// command updates its workspace's record, else it creates one.
async fn in_process_load<S: monoseq_kv::KvStore + Clone + Send + Sync + 'static>(
    cp: &CommandProcessor<S>,
    args: &BenchArgs,
    records: Option<Arc<[u64]>>,
    deadline: Instant,
) -> Tally {
    let mut tasks = Vec::with_capacity(args.clients);
    // With `--expected-wlog-offset`: the last WLog offset seen of each workspace, shared by
    // the clients (a fresh store starts every workspace at 0).
    let ends: Option<Arc<[AtomicU64]>> = args
        .expected_wlog_offset
        .then(|| (0..args.workspaces).map(|_| AtomicU64::new(0)).collect());
    for client in 0..args.clients as u64 {
        let cp = cp.clone();
        let workspaces = args.workspaces;
        let keys = args.idempotency_keys;
        let ends = ends.clone();
        let records = records.clone();
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            let mut i = client;
            let template = command(1);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let ws = i % workspaces + 1;
                i += 7919;
                n += 1;
                let mut cmd = crate::wire::command(body(&template, records.as_deref(), ws, n));
                let end = ends.as_deref().map(|e| &e[(ws - 1) as usize]);
                cmd.expected_wlog_offset = end.map(|e| e.load(Ordering::Relaxed));
                let key = keys.then(|| {
                    monoseq_cp::IdempotencyKey::new(&format!("bench-{client}-{n}"))
                        .expect("a valid key")
                });
                let began = Instant::now();
                match cp.submit_keyed(cmd, key).await {
                    Ok(out) => {
                        t.ok += 1;
                        let _ = t.latency_us.record(began.elapsed().as_micros() as u64);
                        if let Some(e) = end {
                            e.fetch_max(out.wlog_offset, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.current_wlog_offset().is_some() => {
                        t.conflicts += 1;
                        if let (Some(end), Some(current)) = (end, e.current_wlog_offset()) {
                            end.fetch_max(current, Ordering::Relaxed);
                        }
                    }
                    Err(e) if e.is_transient() => {
                        t.busy += 1;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(_) => t.failed += 1,
                }
            }
            t
        }));
    }
    let mut all = Tally::new();
    for task in tasks {
        if let Ok(t) = task.await {
            all.merge(&t);
        }
    }
    all
}

/// The client of `--url`: the crate's own (`monoseq-client`), with one attempt per command so
/// that busy answers are counted rather than retried, `--token` and `--ca-cert`.
fn http_client(url: &str, args: &BenchArgs) -> anyhow::Result<monoseq_client::Client> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("--url must start with http:// or https://");
    }
    if args.ca_cert.is_some() && !url.starts_with("https://") {
        bail!("--ca-cert is for an https:// --url");
    }
    let mut builder = monoseq_client::Client::builder([url])
        .retry_timeout(Duration::ZERO)
        .request_timeout(Duration::from_secs(30));
    if let Some(token) = &args.token {
        builder = builder.token(token.token("--token (MONOSEQ_TOKEN)")?.secret());
    }
    if let Some(ca) = &args.ca_cert {
        let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
        builder = builder.ca_pem(pem);
    }
    Ok(builder.build()?)
}

/// Prints what the server says of itself (`GET /v1/info`: version, partitions, trust level,
/// storage), so that a figure names what it measured.
async fn print_server_info(client: &monoseq_client::Client, url: &str) -> anyhow::Result<()> {
    let info = client
        .info()
        .await
        .with_context(|| format!("asking {url}/v1/info"))?;
    println!(
        "server: version={} partitions={} trust_level={} storage={}",
        info.version, info.partitions, info.trust_level, info.storage,
    );
    Ok(())
}

/// Like [`http_load`], each client sending `size` commands per request: it gathers its
/// commands by the node that owns their partition (as the client last saw it) and sends a
/// node's `size` commands as one batch, so that every request carries `size` commands
/// however many nodes there are.
async fn http_batch_load(
    client: &monoseq_client::Client,
    args: &BenchArgs,
    deadline: Instant,
    size: usize,
) -> anyhow::Result<Tally> {
    let mut tasks = Vec::with_capacity(args.clients);
    for c in 0..args.clients as u64 {
        let client = client.clone();
        let (workspaces, keys) = (args.workspaces, args.idempotency_keys);
        let mut pace = Pace::new(args, size, c);
        tasks.push(tokio::spawn(async move {
            let mut sends = Sends::new(pace.paced());
            let mut i = c;
            let template = monoseq_client::BatchCommandBody::new(command(1), None);
            let mut by_node: HashMap<String, Vec<monoseq_client::BatchCommandBody>> =
                HashMap::new();
            while Instant::now() < deadline {
                let ws = i % workspaces + 1;
                i += 7919;
                let mut item = template.clone();
                item.ws = ws;
                item.idempotency_key = keys.then(monoseq_client::new_idempotency_key);
                let batch = by_node.entry(client.node_of(ws).await).or_default();
                batch.push(item);
                if batch.len() >= size {
                    let batch = std::mem::take(batch);
                    let due = pace.due().await;
                    let (client, tally) = (client.clone(), sends.tally());
                    sends
                        .send(async move { submit_batch(&client, &batch, due, &tally).await })
                        .await?;
                }
            }
            sends.finish().await
        }));
    }
    let mut all = Tally::new();
    for task in tasks {
        all.merge(&task.await??);
    }
    Ok(all)
}

/// Sends one batch, due at `due`, and counts each command's answer, and the batch's latency
/// from `due`.
async fn submit_batch(
    client: &monoseq_client::Client,
    batch: &[monoseq_client::BatchCommandBody],
    due: Instant,
    tally: &Mutex<Tally>,
) {
    let answer = client.submit_batch(batch).await;
    let mut t = lock(tally);
    match answer {
        Ok(results) => {
            for result in results {
                match result {
                    Ok(_) => t.ok += 1,
                    Err(e) => t.count_refused(e.status()),
                }
            }
            let _ = t.latency_us.record(due.elapsed().as_micros() as u64);
        }
        Err(e) => {
            for _ in batch {
                t.count_server_error(e.status());
            }
            t.failed += batch.len() as u64;
        }
    }
}

async fn http_load(
    client: &monoseq_client::Client,
    args: &BenchArgs,
    deadline: Instant,
) -> anyhow::Result<Tally> {
    let mut tasks = Vec::with_capacity(args.clients);
    for c in 0..args.clients as u64 {
        let client = client.clone();
        let workspaces = args.workspaces;
        let keys = args.idempotency_keys;
        let mut pace = Pace::new(args, 1, c);
        tasks.push(tokio::spawn(async move {
            let mut sends = Sends::new(pace.paced());
            let mut i = c;
            let mut command = command(1);
            while Instant::now() < deadline {
                command.ws = i % workspaces + 1;
                i += 7919;
                let began = pace.due().await;
                let (client, command, tally) = (client.clone(), command.clone(), sends.tally());
                sends
                    .send(async move {
                        let answer = if keys {
                            client.submit(&command).await
                        } else {
                            client.submit_unkeyed(&command).await
                        };
                        let busy = matches!(&answer, Err(e) if e.status() == Some(503));
                        lock(&tally).count_one(answer.map(|_| ()), began);
                        if busy {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    })
                    .await?;
            }
            sends.finish().await
        }));
    }
    let mut all = Tally::new();
    for task in tasks {
        all.merge(&task.await??);
    }
    Ok(all)
}

/// One client's requests: under `--rate` each is a task of its own, sent when due whether or
/// not the ones before were answered (at most [`PACED_IN_FLIGHT_MAX`] at once); unpaced, each
/// is awaited before the next. Every request counts its answer into the client's tally.
struct Sends {
    tally: Arc<Mutex<Tally>>,
    in_flight: Option<tokio::task::JoinSet<()>>,
    held: u64,
}

impl Sends {
    fn new(paced: bool) -> Sends {
        Sends {
            tally: Arc::new(Mutex::new(Tally::new())),
            in_flight: paced.then(tokio::task::JoinSet::new),
            held: 0,
        }
    }

    /// The tally a request counts its answer into.
    fn tally(&self) -> Arc<Mutex<Tally>> {
        Arc::clone(&self.tally)
    }

    async fn send(
        &mut self,
        request: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let Some(in_flight) = &mut self.in_flight else {
            request.await;
            return Ok(());
        };
        // Answered requests leave the set first: `len` counts them until they are joined, so
        // without this every request past the first PACED_IN_FLIGHT_MAX would count as held.
        while let Some(done) = in_flight.try_join_next() {
            done.context("a paced request failed")?;
        }
        if in_flight.len() >= PACED_IN_FLIGHT_MAX {
            self.held += 1;
            if let Some(done) = in_flight.join_next().await {
                done.context("a paced request failed")?;
            }
        }
        in_flight.spawn(request);
        Ok(())
    }

    /// Waits for every request still in flight; answers the client's tally.
    async fn finish(mut self) -> anyhow::Result<Tally> {
        if let Some(in_flight) = &mut self.in_flight {
            while let Some(done) = in_flight.join_next().await {
                done.context("a paced request failed")?;
            }
        }
        let mut tally = std::mem::replace(&mut *lock(&self.tally), Tally::new());
        tally.held = self.held;
        Ok(tally)
    }
}

fn lock(tally: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        bench: BenchArgs,
    }

    /// Paced clients spread their requests over each period: all sent at the same instants,
    /// every client's request would arrive in one burst that the last of them waits through,
    /// and the measured latency would be that burst's, not the server's under an even load.
    #[tokio::test]
    async fn paced_clients_send_their_requests_spread_evenly_over_the_period_not_at_once() {
        let flags = Flags::parse_from([
            "bench",
            "--url",
            "http://127.0.0.1:1",
            "--clients",
            "4",
            "--rate",
            "4000",
        ]);
        // 4 clients × 100 commands a request ÷ 4 000 commands/s: a request every 100 ms each.
        let period = Duration::from_millis(100);
        let mut paces: Vec<Pace> = (0..4).map(|c| Pace::new(&flags.bench, 100, c)).collect();
        let mut first = Vec::new();
        for pace in &mut paces {
            first.push(pace.due().await);
        }
        for (c, due) in first.iter().enumerate().skip(1) {
            let gap = due.duration_since(first[c - 1]);
            let (low, high) = (
                period / 4 - Duration::from_millis(2),
                period / 4 + period / 50,
            );
            assert!(
                gap >= low && gap <= high,
                "client {c} is due {gap:?} after client {}, not a quarter of {period:?}",
                c - 1
            );
        }
        let next = paces[3].due().await;
        assert_eq!(next.duration_since(first[3]), period, "the schedule moved");
    }

    /// A paced client must not hold a due request behind the answer of the one before it: its
    /// latency would then be its own queue's, not the server's.
    #[tokio::test]
    async fn a_paced_client_sends_when_due_without_waiting_for_the_answer_before() {
        let mut sends = Sends::new(true);
        let (answer, answered) = tokio::sync::oneshot::channel::<()>();
        let (first, second) = (sends.tally(), sends.tally());
        let done = tokio::time::timeout(Duration::from_secs(30), async move {
            sends
                .send(async move {
                    // Answered only once the next request has been sent.
                    answered.await.unwrap();
                    lock(&first).ok += 1;
                })
                .await
                .unwrap();
            sends
                .send(async move {
                    answer.send(()).unwrap();
                    lock(&second).ok += 1;
                })
                .await
                .unwrap();
            sends.finish().await.unwrap()
        })
        .await
        .expect("the second request was held behind the first one's answer");
        assert_eq!((done.ok, done.held), (2, 0));
    }

    #[tokio::test]
    async fn a_paced_client_past_its_in_flight_limit_waits_for_an_answer_and_counts_it_held() {
        let mut sends = Sends::new(true);
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        for _ in 0..=PACED_IN_FLIGHT_MAX {
            let (tally, release) = (sends.tally(), Arc::clone(&release));
            if sends.in_flight.as_ref().unwrap().len() == PACED_IN_FLIGHT_MAX {
                // Every slot is taken: let one request be answered.
                release.add_permits(1);
            }
            sends
                .send(async move {
                    release.acquire().await.unwrap().forget();
                    lock(&tally).ok += 1;
                })
                .await
                .unwrap();
        }
        assert_eq!(sends.in_flight.as_ref().unwrap().len(), PACED_IN_FLIGHT_MAX);
        release.add_permits(PACED_IN_FLIGHT_MAX);
        let done = sends.finish().await.unwrap();
        assert_eq!((done.ok, done.held), (PACED_IN_FLIGHT_MAX as u64 + 1, 1));
    }

    /// `held` counts the waits for an answer, so a paced client whose requests are all
    /// answered before its next is due holds none, however many it sends.
    #[tokio::test]
    async fn a_paced_client_whose_requests_are_answered_in_time_counts_none_held() {
        let mut sends = Sends::new(true);
        let sent = 3 * PACED_IN_FLIGHT_MAX as u64;
        for _ in 0..sent {
            let tally = sends.tally();
            let (answered, is_answered) = tokio::sync::oneshot::channel::<()>();
            sends
                .send(async move {
                    lock(&tally).ok += 1;
                    let _ = answered.send(());
                })
                .await
                .unwrap();
            // The request is answered before the next one is due.
            is_answered.await.unwrap();
            tokio::task::yield_now().await;
        }
        let done = sends.finish().await.unwrap();
        assert_eq!((done.ok, done.held), (sent, 0));
    }

    #[tokio::test]
    async fn an_unpaced_client_sends_its_next_request_once_the_last_is_answered() {
        let mut sends = Sends::new(false);
        let order = Arc::new(Mutex::new(Vec::new()));
        for n in 0..3 {
            let answered = Arc::clone(&order);
            sends
                .send(async move {
                    tokio::task::yield_now().await;
                    answered.lock().unwrap().push(n);
                })
                .await
                .unwrap();
            assert_eq!(order.lock().unwrap().len(), n + 1);
        }
        assert_eq!(sends.finish().await.unwrap().held, 0);
    }
}
