//! Runs the real `monoseq` binary as a child process for end-to-end tests.

#![allow(dead_code)]

pub mod keyed;
pub mod node;
pub mod openapi;
pub mod sse;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_monoseq");

/// Where a test's server keeps its data.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The embedded engine in the test's data directory.
    Embedded,
    /// A fresh database of this test binary's private PostgreSQL cluster.
    Postgres(String),
}

impl Backend {
    /// A fresh database on the test binary's private PostgreSQL cluster (started on first
    /// use; PostgreSQL must be installed: `apt-get install postgresql`).
    pub fn postgres() -> Backend {
        let cluster = monoseq_pg::testing::PgCluster::shared()
            .unwrap_or_else(|e| panic!("a private PostgreSQL cluster: {e}"));
        let url = cluster
            .create_database()
            .unwrap_or_else(|e| panic!("a fresh database: {e}"));
        Backend::Postgres(url)
    }

    /// The connection string of a fresh database on the test binary's private cluster.
    pub fn postgres_url() -> String {
        match Backend::postgres() {
            Backend::Postgres(url) => url,
            Backend::Embedded => unreachable!("postgres() gives a database"),
        }
    }

    /// The flags that select this backend (`serve`, `verify`, `inspect`, `seq`).
    pub fn args(&self) -> Vec<String> {
        match self {
            Backend::Embedded => Vec::new(),
            Backend::Postgres(url) => vec!["--storage".into(), url.clone()],
        }
    }

    /// `monoseq verify` of this backend with data directory `dir`.
    pub fn verify(&self, dir: &Path) -> std::process::Output {
        let dir = dir.to_string_lossy().into_owned();
        let mut args = vec!["verify".to_owned(), "--data-dir".to_owned(), dir];
        args.extend(self.args());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    }
}

/// A running `monoseq serve`. Every answer it gives is logged (`MONOSEQ_ANSWER_LOG`) and
/// checked against the OpenAPI document when it is dropped (unless the test already failed).
pub struct Server {
    pub child: Child,
    pub url: String,
    answers: AnswerLog,
}

/// Where a server logs its answers.
pub struct AnswerLog(tempfile::TempDir);

impl AnswerLog {
    pub fn new() -> AnswerLog {
        AnswerLog(tempfile::tempdir().expect("a directory for the answer log"))
    }

    /// The file, to pass as `MONOSEQ_ANSWER_LOG`.
    pub fn path(&self) -> std::path::PathBuf {
        self.0.path().join("answers.jsonl")
    }

    /// Every answer logged so far (a line cut by a kill left out).
    pub fn answers(&self) -> Vec<openapi::Answer> {
        let log = std::fs::read_to_string(self.path()).unwrap_or_default();
        let whole = log.rfind('\n').map_or("", |end| &log[..end]);
        whole
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// Panics naming every logged answer that breaks the document.
    pub fn assert_conforms(&self) {
        openapi::assert_log_conforms(&self.path());
    }
}

impl Server {
    /// Every answer this server gave so far, as logged for the OpenAPI check.
    pub fn answers(&self) -> Vec<openapi::Answer> {
        self.answers.answers()
    }

    /// Starts `monoseq serve` on `dir` and a free loopback port; waits until it listens.
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
        let answers = AnswerLog::new();
        let mut serve = Command::new(BIN);
        serve.env("MONOSEQ_ANSWER_LOG", answers.path());
        let (child, url) = spawn_serve(serve, dir, "127.0.0.1:0", extra);
        Server {
            child,
            url,
            answers,
        }
    }

    /// Starts `monoseq serve` on `dir` (stderr to `log`); answers the server once it listens,
    /// or what it wrote to stderr when it exits first (a refused start).
    pub fn try_start(dir: &Path, extra: &[&str], log: &Path) -> Result<Server, String> {
        let answers = AnswerLog::new();
        let mut child = Command::new(BIN)
            .env("MONOSEQ_ANSWER_LOG", answers.path())
            .arg("serve")
            .arg("--data-dir")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).expect("create the log file"))
            .spawn()
            .expect("spawn monoseq serve");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the listening line");
        match line.trim().strip_prefix("monoseq listening on ") {
            Some(url) => Ok(Server {
                child,
                url: url.to_owned(),
                answers,
            }),
            None => {
                let status = child.wait().expect("reap");
                let log = std::fs::read_to_string(log).unwrap_or_default();
                assert!(
                    !status.success(),
                    "a server that never listened exited 0: {log}"
                );
                Err(log)
            }
        }
    }

    /// [`start`](Server::start), then [`ready`](Server::ready).
    pub async fn start_ready(dir: &Path, extra: &[&str], client: &reqwest::Client) -> Server {
        let server = Server::start(dir, extra);
        server.ready(client).await;
        server
    }

    /// Sends SIGTERM and waits for the exit, at most `bound`.
    pub fn terminate(mut self, bound: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "server did not stop within {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL: a crash.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// Waits until `/readyz` answers 200.
    pub async fn ready(&self, client: &reqwest::Client) {
        wait_ready(&self.url, client).await;
    }
}

/// Waits (at most 30 s) until the server at `url` answers `/readyz` with 200.
pub async fn wait_ready(url: &str, client: &reqwest::Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "server never became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            self.answers.assert_conforms();
        }
    }
}

/// Runs `monoseq <args>` to completion.
pub fn run(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().expect("run monoseq")
}

/// Backs up the server at `url` into `to` with `monoseq backup`; panics with its error output
/// when the backup fails.
pub fn backup_via_cli(url: &str, to: &Path) {
    let out = run(&[
        "backup",
        "--url",
        url,
        "--to",
        to.to_str().expect("a UTF-8 path"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The URL a started `monoseq serve` printed on its first line of output; panics with its log
/// when it exits first (a refused start).
pub fn listening_url(child: &mut Child, log: &Path) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    match line.trim().strip_prefix("monoseq listening on ") {
        Some(url) => url.to_owned(),
        None => {
            let _ = child.wait();
            panic!(
                "the server did not start: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        }
    }
}

/// The `/metrics` text of the server at `url`.
pub async fn metrics(client: &reqwest::Client, url: &str) -> String {
    client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the metrics text")
}

/// The value of a series without labels in a `/metrics` text; panics naming it when absent.
pub fn metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics"))
}

/// `monoseq serve` (`command`, with what it already holds) on `dir` and `listen`, with `extra`
/// flags; the child and its URL once it listens.
fn spawn_serve(mut command: Command, dir: &Path, listen: &str, extra: &[&str]) -> (Child, String) {
    let mut child = command
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", listen])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn monoseq serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read the listening line");
    let url = line
        .trim()
        .strip_prefix("monoseq listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (child, url)
}

/// A free loopback port, for a server that must listen again where it listened before.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// `monoseq serve` on a port chosen up front ([`free_port`]), so a restart listens where the
/// tail or projector was; killed when dropped (also when a test fails).
pub struct FixedServer {
    child: Child,
}

impl FixedServer {
    /// Starts it on `dir`, 4 partitions, loopback `port`, with `extra` flags; returns once it
    /// listens.
    pub fn start(dir: &Path, port: u16, extra: &[&str]) -> FixedServer {
        let listen = format!("127.0.0.1:{port}");
        let flags = [&["--partitions", "4"], extra].concat();
        let (child, _) = spawn_serve(Command::new(BIN), dir, &listen, &flags);
        FixedServer { child }
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }
}

impl Drop for FixedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
