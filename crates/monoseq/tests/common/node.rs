//! One node of a cluster on PostgreSQL: `monoseq serve` as a child process under a name, with
//! its storage, its marks directory and its log in a file the test reads, started on loopback
//! or inside a network namespace (`ip netns exec`, which replaces itself by the server: the
//! child is the server); stopped by SIGTERM, crashed by SIGKILL, paused by SIGSTOP. Like a
//! single [`Server`](super::Server), every answer a node gives is logged
//! (`MONOSEQ_ANSWER_LOG`) and checked against `docs/openapi.json` when it is dropped, so the
//! answers only a cluster gives (a 307, `not_owner`, `owner_unreachable`, `/v1/cluster`) are
//! checked too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{AnswerLog, BIN};

/// Partitions of every cluster unless a test asks for others (`--partitions`).
pub const PARTITIONS: u64 = 6;
/// Lease of every node unless a test asks for another (`--lease-ms`), and its renewal
/// interval.
pub const LEASE_MS: u64 = 1_500;
pub const RENEW_MS: u64 = 300;

/// Variables that would send a node's own HTTP calls (forwarding) through a proxy.
const PROXY_VARIABLES: [&str; 6] = [
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
];

/// A running (or refused) `monoseq serve` of a cluster.
pub struct Node {
    pub id: String,
    /// Empty until it listens ([`Node::listening`]).
    pub url: String,
    pub log: PathBuf,
    child: Child,
    answers: AnswerLog,
}

/// How to start a node: `Node::on(db, id, dir)`, then what differs from the defaults.
pub struct Start {
    db: String,
    id: String,
    dir: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    netns: Option<String>,
    listen: String,
    lease: (u64, u64),
    kept_marks: bool,
}

impl Start {
    /// Further `serve` flags (a `--partitions`, `--lease-ms` or `--marks-dir` among them
    /// replaces the default).
    pub fn args(mut self, args: &[&str]) -> Start {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// An environment variable of the process.
    pub fn env(mut self, name: &str, value: &str) -> Start {
        self.envs.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Lease and renewal interval, in milliseconds.
    pub fn lease(mut self, lease_ms: u64, renew_ms: u64) -> Start {
        self.lease = (lease_ms, renew_ms);
        self
    }

    /// The marks directory [`Node::marks_of`], kept across restarts under the same name
    /// (without it, each process has marks of its own: a second run under a live name is then
    /// refused by the membership, not by the marks directory's lock).
    pub fn kept_marks(mut self) -> Start {
        self.kept_marks = true;
        self
    }

    /// Inside network namespace `ns`, listening on `listen` (`ip:port`) and advertising it.
    pub fn in_netns(mut self, ns: &str, listen: &str) -> Start {
        self.netns = Some(ns.to_owned());
        self.listen = listen.to_owned();
        self
    }

    fn has(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag)
    }

    /// Starts the process without waiting for it to listen ([`Node::listening`]).
    pub fn spawn(self) -> Node {
        let log = self.dir.join(format!("{}.log", self.id));
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, BIN]);
                c
            }
            None => Command::new(BIN),
        };
        command
            .args(["serve", "--storage", &self.db, "--listen", &self.listen])
            .args(["--node-id", &self.id]);
        if !self.has("--lease-ms") {
            let (lease, renew) = (self.lease.0.to_string(), self.lease.1.to_string());
            command.args(["--lease-ms", &lease, "--lease-renew-ms", &renew]);
        }
        if !self.has("--partitions") {
            command.args(["--partitions", &PARTITIONS.to_string()]);
        }
        if !self.has("--marks-dir") {
            let marks = if self.kept_marks {
                Node::marks_of(&self.dir, &self.id)
            } else {
                static RUNS: AtomicU64 = AtomicU64::new(0);
                let run = RUNS.fetch_add(1, Ordering::Relaxed);
                self.dir.join(format!("marks-{}-{run}", self.id))
            };
            command.arg("--marks-dir").arg(marks);
        }
        if !self.listen.starts_with("127.") {
            // A private address of the test's own network, reached by nobody else.
            command.args(["--advertise-url", &format!("http://{}", self.listen)]);
            command.arg("--allow-unauthenticated");
        }
        command.args(&self.args);
        for v in PROXY_VARIABLES {
            command.env_remove(v);
        }
        let answers = AnswerLog::new();
        let child = command
            .env("MONOSEQ_ANSWER_LOG", answers.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .expect("open the node's log"),
            )
            .spawn()
            .expect("spawn monoseq serve");
        Node {
            id: self.id,
            url: String::new(),
            log,
            child,
            answers,
        }
    }

    /// Starts the process and waits until it listens.
    pub fn start(self) -> Node {
        self.spawn().listening()
    }
}

impl Node {
    /// Node `id` on database `db`, its log and marks under `dir`: on loopback, with
    /// [`PARTITIONS`] partitions and a lease of [`LEASE_MS`], unless told otherwise.
    pub fn on(db: &str, id: &str, dir: &Path) -> Start {
        Start {
            db: db.to_owned(),
            id: id.to_owned(),
            dir: dir.to_path_buf(),
            args: Vec::new(),
            envs: Vec::new(),
            netns: None,
            listen: "127.0.0.1:0".to_owned(),
            lease: (LEASE_MS, RENEW_MS),
            kept_marks: false,
        }
    }

    /// Starts node `id` on `db` with the defaults and `args`; waits until it listens.
    pub fn start(db: &str, id: &str, dir: &Path, args: &[&str]) -> Node {
        Node::on(db, id, dir).args(args).start()
    }

    /// Starts every one of `starts` at once, then waits until each listens.
    pub fn start_together(starts: Vec<Start>) -> Vec<Node> {
        let spawned: Vec<Node> = starts.into_iter().map(Start::spawn).collect();
        spawned.into_iter().map(Node::listening).collect()
    }

    /// The marks directory of node `id` under `dir` that [`Start::kept_marks`] keeps.
    pub fn marks_of(dir: &Path, id: &str) -> PathBuf {
        dir.join(format!("marks-{id}"))
    }

    /// Waits until the node listens; panics with its log when it exits first.
    pub fn listening(mut self) -> Node {
        self.url = super::listening_url(&mut self.child, &self.log);
        self
    }

    /// Its process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The node's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every answer the node gave so far, as logged for the OpenAPI check.
    pub fn answers(&self) -> Vec<super::openapi::Answer> {
        self.answers.answers()
    }

    /// Its exit status, once it exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait for the node")
    }

    /// Sends `signal` (`-STOP`, `-CONT`, `-TERM`, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", self.id);
    }

    /// SIGKILL: a crash.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, and the exit within `bound`.
    pub fn terminate(mut self, bound: Duration) {
        self.signal("-TERM");
        let deadline = Instant::now() + bound;
        while self.try_wait().is_none() {
            assert!(
                Instant::now() < deadline,
                "{} did not stop within {bound:?}",
                self.id
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            self.answers.assert_conforms();
        }
    }
}

/// The URLs of `nodes`.
pub fn urls_of(nodes: &[Node]) -> Vec<String> {
    nodes.iter().map(|n| n.url.clone()).collect()
}

/// One line of a node's text log: its timestamp (RFC 3339, UTC, fixed width, so that two
/// compare as strings), and its `name=value` fields.
#[derive(Debug)]
pub struct LogLine<'a> {
    pub at: &'a str,
    pub text: &'a str,
}

impl<'a> LogLine<'a> {
    pub fn parse(text: &'a str) -> Option<LogLine<'a>> {
        let at = text.split_whitespace().next()?;
        at.ends_with('Z').then_some(LogLine { at, text })
    }

    /// The value of field `name` (`name=value`), when the line has it.
    pub fn field(&self, name: &str) -> Option<u64> {
        self.text
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim_matches('"').parse().ok())
    }
}
