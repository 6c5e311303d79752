//! `monoseq bench`: a load generator. Against a running server over HTTP or HTTPS (`--url`,
//! with `--token` and `--ca-cert`), or in-process straight into the command processor on a
//! fresh embedded store. Prints the throughput and latency percentiles.
//!
//! In-process, the shared (hidden) `--no-marks` setting runs the command processor without
//! high-water marks, to measure what they cost; against a server, start the server with it.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use hdrhistogram::Histogram;
use monoseq_cp::CommandProcessor;
use monoseq_store::{EventStore, TrustLevel};
use serde_json::json;

use crate::config::{APP, Settings, open_storage};
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
}

/// The command every client sends: one CDoc, an argument ODoc referring to it.
fn command(ws: u64) -> CommandBody {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "bench.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "bench.Doc", "fields": {"n": ws}}],
        "argument": {"raw_id": 2, "name": "bench.Arg", "fields": {"doc": {"$raw": 1}}}
    }))
    .expect("valid bench command")
}

/// What the clients measured.
struct Tally {
    ok: u64,
    busy: u64,
    failed: u64,
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            ok: 0,
            busy: 0,
            failed: 0,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.ok += other.ok;
        self.busy += other.busy;
        self.failed += other.failed;
        let _ = self.latency_us.add(&other.latency_us);
    }
}

/// Runs the bench and prints one line of results.
pub async fn run(args: BenchArgs, mut settings: Settings) -> anyhow::Result<()> {
    if args.clients == 0 || args.workspaces == 0 {
        bail!("--clients and --workspaces must be at least 1");
    }
    if let Some(url) = &args.url {
        print_server_info(url, &args).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let (mode, tally, elapsed) = match &args.url {
        Some(url) => {
            let began = Instant::now();
            let t = http_load(url, &args, deadline).await?;
            ("http", t, began.elapsed())
        }
        None => {
            let temp;
            let dir = match &args.bench_dir {
                Some(d) => d.clone(),
                None => {
                    temp = tempfile::tempdir().context("creating a temporary directory")?;
                    temp.path().to_path_buf()
                }
            };
            settings.data_dir = dir;
            let opened = open_storage(&mut settings)?;
            let mut config = settings.cp_config();
            // `--no-marks` is the processor settings flag (`ProcessorArgs`), not a bench flag: one
            // argument id per command line.
            if !settings.no_marks {
                config.marks = opened.marks;
            }
            let cp =
                CommandProcessor::start(EventStore::new(opened.kv, APP, settings.trust), config)?;
            while !cp.ready() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let began = Instant::now();
            let t = in_process_load(&cp, &args, deadline).await;
            let elapsed = began.elapsed();
            cp.shutdown(settings.shutdown_timeout).await;
            ("in-process", t, elapsed)
        }
    };
    let trust = match (&args.url, settings.trust) {
        (Some(_), _) => "server's",
        (None, TrustLevel::Level0) => "0",
        (None, TrustLevel::Level1) => "1",
        (None, _) => "2",
    };
    let h = &tally.latency_us;
    println!(
        "bench: mode={mode} trust={trust} partitions={} clients={} ok={} busy={} failed={} \
         throughput={:.0} cmd/s p50={}us p90={}us p99={}us p999={}us max={}us",
        if args.url.is_some() {
            "server's".to_owned()
        } else {
            settings.partitions.to_string()
        },
        args.clients,
        tally.ok,
        tally.busy,
        tally.failed,
        tally.ok as f64 / elapsed.as_secs_f64(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.9),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
    );
    Ok(())
}

async fn in_process_load<S: monoseq_kv::KvStore + Clone + Send + Sync + 'static>(
    cp: &CommandProcessor<S>,
    args: &BenchArgs,
    deadline: Instant,
) -> Tally {
    let mut tasks = Vec::with_capacity(args.clients);
    for client in 0..args.clients as u64 {
        let cp = cp.clone();
        let workspaces = args.workspaces;
        let keys = args.idempotency_keys;
        tasks.push(tokio::spawn(async move {
            let mut t = Tally::new();
            let mut i = client;
            let template = command(1);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let ws = i % workspaces + 1;
                i += 7919;
                n += 1;
                let mut cmd = crate::wire::command(template.clone());
                cmd.ws = ws;
                let key = keys.then(|| {
                    monoseq_cp::IdempotencyKey::new(&format!("bench-{client}-{n}"))
                        .expect("a valid key")
                });
                let began = Instant::now();
                match cp.submit_keyed(cmd, key).await {
                    Ok(_) => {
                        t.ok += 1;
                        let _ = t.latency_us.record(began.elapsed().as_micros() as u64);
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

/// Where the HTTP clients connect, and how.
#[derive(Clone)]
struct Target {
    addr: std::net::SocketAddr,
    authority: hyper::http::uri::Authority,
    path: String,
    /// For https: the TLS client and the name the server's certificate must carry.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
    /// `Bearer <token>`, marked sensitive.
    authorization: Option<hyper::header::HeaderValue>,
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>;

impl Target {
    async fn new(url: &str, args: &BenchArgs) -> anyhow::Result<Target> {
        let uri: hyper::Uri = format!("{}/v1/commands", url.trim_end_matches('/'))
            .parse()
            .with_context(|| format!("parsing --url {url}"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => bail!("--url must start with http:// or https://"),
        };
        if args.ca_cert.is_some() && !https {
            bail!("--ca-cert is for an https:// --url");
        }
        let authority = uri
            .authority()
            .with_context(|| format!("--url {url} names no host"))?
            .clone();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addr = tokio::net::lookup_host((authority.host(), port))
            .await
            .with_context(|| format!("resolving {authority}"))?
            .next()
            .with_context(|| format!("{authority} resolves to no address"))?;
        let tls = if https {
            let config = crate::tls::client_config(args.ca_cert.as_deref())?;
            let host = authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .with_context(|| format!("{host} is not a valid TLS server name"))?;
            Some((tokio_rustls::TlsConnector::from(config), name))
        } else {
            None
        };
        Ok(Target {
            addr,
            path: uri.path().to_owned(),
            authority,
            tls,
            authorization: match &args.token {
                Some(token) => Some(token.token("--token (MONOSEQ_TOKEN)")?.authorization()),
                None => None,
            },
        })
    }

    /// One keep-alive HTTP/1.1 connection, driven by its own task.
    async fn connect(&self) -> anyhow::Result<Sender> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .context("connecting to the server")?;
        stream.set_nodelay(true)?;
        match &self.tls {
            None => handshake(stream).await,
            Some((connector, name)) => {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .with_context(|| format!("TLS handshake with {}", self.authority))?;
                handshake(stream).await
            }
        }
    }
}

async fn handshake<S>(stream: S) -> anyhow::Result<Sender>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Prints what the server says of itself (`GET /v1/info`: version, partitions, trust level,
/// storage), so that a figure names what it measured.
async fn print_server_info(url: &str, args: &BenchArgs) -> anyhow::Result<()> {
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(10));
    if url.starts_with("https://") {
        let tls = crate::tls::client_config(args.ca_cert.as_deref())?;
        client = client.tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls));
    }
    let target = format!("{}/v1/info", url.trim_end_matches('/'));
    let mut request = client.build()?.get(&target);
    if let Some(token) = &args.token {
        let authorization = token.token("--token (MONOSEQ_TOKEN)")?.authorization();
        request = request.header(reqwest::header::AUTHORIZATION, authorization);
    }
    let info: serde_json::Value = request
        .send()
        .await
        .with_context(|| format!("asking {target}"))?
        .error_for_status()
        .with_context(|| format!("asking {target}"))?
        .json()
        .await
        .with_context(|| format!("reading the answer of {target}"))?;
    println!(
        "server: version={} partitions={} trust_level={} storage={}",
        info["version"].as_str().unwrap_or("?"),
        info["partitions"],
        info["trust_level"],
        info["storage"].as_str().unwrap_or("?"),
    );
    Ok(())
}

async fn http_load(url: &str, args: &BenchArgs, deadline: Instant) -> anyhow::Result<Tally> {
    let target = Target::new(url, args).await?;
    let mut tasks = Vec::with_capacity(args.clients);
    for c in 0..args.clients as u64 {
        let target = target.clone();
        let workspaces = args.workspaces;
        let keys = args.idempotency_keys;
        tasks.push(tokio::spawn(async move {
            // One keep-alive connection per client, driven by its own task: no pool to check
            // out from, no URL to parse per request.
            let mut sender = target.connect().await?;
            let mut t = Tally::new();
            let mut i = c;
            let mut template = command(1);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let ws = i % workspaces + 1;
                i += 7919;
                n += 1;
                template.ws = ws;
                let body = serde_json::to_vec(&template).expect("a command serializes");
                let mut request = hyper::Request::post(target.path.as_str())
                    .header(hyper::header::HOST, target.authority.as_str())
                    .header(hyper::header::CONTENT_TYPE, "application/json");
                if let Some(authorization) = &target.authorization {
                    request = request.header(hyper::header::AUTHORIZATION, authorization.clone());
                }
                if keys {
                    request = request.header("idempotency-key", format!("bench-{c}-{n}"));
                }
                let request = request
                    .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
                    .expect("a valid request");
                let began = Instant::now();
                if sender.ready().await.is_err() {
                    t.failed += 1;
                    break;
                }
                match sender.send_request(request).await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        let _ = http_body_util::BodyExt::collect(r.into_body()).await;
                        match status {
                            200..=299 => {
                                t.ok += 1;
                                let _ = t.latency_us.record(began.elapsed().as_micros() as u64);
                            }
                            503 => {
                                t.busy += 1;
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            _ => t.failed += 1,
                        }
                    }
                    Err(_) => {
                        t.failed += 1;
                        break;
                    }
                }
            }
            anyhow::Ok(t)
        }));
    }
    let mut all = Tally::new();
    for task in tasks {
        all.merge(&task.await??);
    }
    Ok(all)
}
