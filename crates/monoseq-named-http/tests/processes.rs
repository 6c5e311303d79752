//! Named sequences shared by several processes, with processes stalled (SIGSTOP) and killed
//! (SIGKILL) in the middle of operations. This file is its own harness (`harness = false`):
//! run with `MONOSEQ_NAMED_ROLE` set, the test binary plays a child's part instead.
//!
//! - On the embedded store, one process holds the data directory (its lock admits one), so the
//!   processes share a sequence the way deployments do: a server process owns the store and
//!   serves `router`, and 4 worker processes × 4 tasks call `next` over HTTP. Every number is
//!   unique and, with no failure injected, the numbers are gapless. The server is then killed
//!   with SIGKILL and restarted on the same directory, or stopped with SIGSTOP for longer than
//!   every timeout: no number is handed out twice and the sequence keeps going.
//! - On S3 (moto), processes share the bucket directly: a caller stopped between its read and
//!   its conditional write, or killed there, leaves no lock behind and cannot hand out a
//!   duplicate. moto is not atomic under simultaneous conditional writes, so these tests keep
//!   one writer active at a time.

/// The moto harness of `monoseq-named`'s own S3 tests, shared rather than copied.
#[allow(dead_code)]
#[path = "../../monoseq-named/tests/support/moto.rs"]
mod moto;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use monoseq_client::SequencesClient as Client;
use monoseq_kv::{Durability, FjallStore, Options};
use monoseq_named::{
    Address, Backend, BoxFuture, KvBackend, NextError, NextOptions, Object, S3Backend, S3Config,
    Sequences, StorageError, Version, WriteFailure,
};
use monoseq_named_http::{Coded, router};

const ROLE_VAR: &str = "MONOSEQ_NAMED_ROLE";
const ADDRESS: &str = "orders/invoice";
/// Worker processes and tasks per process of the contention tests.
const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 4;
const READY_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Children.

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// Owns the embedded store in `MONOSEQ_NAMED_DIR` and serves the API on `MONOSEQ_NAMED_PORT`.
fn run_server() {
    let dir = env("MONOSEQ_NAMED_DIR");
    let port: u16 = env("MONOSEQ_NAMED_PORT").parse().unwrap();
    runtime().block_on(async {
        let options = Options::default().durability(Durability::GroupCommit {
            max_delay: Duration::from_millis(5),
        });
        let store = FjallStore::open(Path::new(&dir), options).unwrap();
        let sequences = Sequences::new(KvBackend::new(store));
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .unwrap();
        println!("ready");
        std::io::stdout().flush().unwrap();
        axum::serve(listener, router(sequences)).await.unwrap();
    });
}

/// Calls `next` from `TASKS_PER_PROCESS` tasks for `MONOSEQ_NAMED_MILLIS`, printing `v N` per
/// number and `e CODE` per failure (then retrying after a pause).
fn run_worker() {
    let url = env("MONOSEQ_NAMED_URL");
    let millis: u64 = env("MONOSEQ_NAMED_MILLIS").parse().unwrap();
    let timeout_ms: u64 = env("MONOSEQ_NAMED_TIMEOUT_MS").parse().unwrap();
    let (lines, printed) = mpsc::channel::<String>();
    let printer = std::thread::spawn(move || {
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        for line in printed {
            writeln!(out, "{line}").unwrap();
        }
    });
    runtime().block_on(async {
        let client = Client::new(&url).unwrap();
        let address: Address = ADDRESS.parse().unwrap();
        let options = NextOptions::new().timeout(Duration::from_millis(timeout_ms));
        let end = Instant::now() + Duration::from_millis(millis);
        let mut tasks = Vec::new();
        for _ in 0..TASKS_PER_PROCESS {
            let (client, address, options, lines) = (
                client.clone(),
                address.clone(),
                options.clone(),
                lines.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    match client.next(&address, &options).await {
                        Ok(value) => lines.send(format!("v {value}")).unwrap(),
                        Err(e) => {
                            lines.send(format!("e {}", e.code())).unwrap();
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    drop(lines);
    printer.join().unwrap();
}

/// An S3 backend that announces each step on stdout and pauses before each write, so that the
/// parent can stop or kill the process between its read and its conditional write.
struct Announcing {
    inner: S3Backend,
    pause: Duration,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

impl Announcing {
    async fn write(
        &self,
        write: BoxFuture<'_, Result<Version, WriteFailure>>,
    ) -> Result<Version, WriteFailure> {
        say("read");
        tokio::time::sleep(self.pause).await;
        say("writing");
        let result = write.await;
        say(match &result {
            Ok(_) => "written",
            Err(WriteFailure::Conflict) => "refused",
            Err(_) => "failed",
        });
        result
    }
}

impl Backend for Announcing {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        self.inner.load(key)
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(self.write(self.inner.create(key, bytes)))
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(self.write(self.inner.replace(key, expected, bytes)))
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.inner.remove(key)
    }
}

fn s3_backend(endpoint: &str, bucket: &str) -> S3Backend {
    let config = S3Config::new(bucket)
        .endpoint(endpoint)
        .credentials("testing", "testing");
    S3Backend::new(&config).unwrap()
}

/// One `next` on the bucket, straight to S3, announcing its steps; prints `v N` or `e CODE`.
fn run_s3_caller() {
    let backend = Announcing {
        inner: s3_backend(&env("MONOSEQ_S3_ENDPOINT"), &env("MONOSEQ_NAMED_BUCKET")),
        pause: Duration::from_millis(env("MONOSEQ_NAMED_PAUSE_MS").parse().unwrap()),
    };
    let timeout = Duration::from_millis(env("MONOSEQ_NAMED_TIMEOUT_MS").parse().unwrap());
    runtime().block_on(async {
        let sequences = Sequences::new(backend);
        let address: Address = ADDRESS.parse().unwrap();
        match sequences
            .next(&address, &NextOptions::new().timeout(timeout))
            .await
        {
            Ok(value) => say(&format!("v {value}")),
            Err(e) => say(&format!("e {}", e.error_code())),
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Parent side.

fn child(role: &str, vars: &[(&str, String)]) -> Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .env(ROLE_VAR, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (name, value) in vars {
        command.env(name, value);
    }
    command.spawn().unwrap()
}

/// Forwards a child's stdout lines to a channel from a thread.
fn lines(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (send, receive) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if send.send(line).is_err() {
                break;
            }
        }
    });
    receive
}

fn expect_line(lines: &mpsc::Receiver<String>, expected: &str) {
    let line = lines
        .recv_timeout(READY_TIMEOUT)
        .unwrap_or_else(|e| panic!("no {expected:?} from the child: {e}"));
    assert_eq!(line, expected);
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} failed");
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct ServerProcess {
    child: Child,
}

impl ServerProcess {
    fn start(dir: &Path, port: u16) -> ServerProcess {
        let started = Instant::now();
        loop {
            let mut child = child(
                "server",
                &[
                    ("MONOSEQ_NAMED_DIR", dir.display().to_string()),
                    ("MONOSEQ_NAMED_PORT", port.to_string()),
                ],
            );
            let stdout = lines(child.stdout.take().unwrap());
            if stdout.recv_timeout(READY_TIMEOUT).as_deref() == Ok("ready") {
                return ServerProcess { child };
            }
            // The port or the directory may still be held by the previous server for a moment.
            let _ = child.kill();
            let _ = child.wait();
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "the server does not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the worker processes printed: numbers, and failure codes.
struct Outcome {
    values: Vec<u64>,
    errors: Vec<String>,
}

fn start_workers(url: &str, millis: u64, timeout_ms: u64) -> Vec<Child> {
    (0..PROCESSES)
        .map(|_| {
            child(
                "worker",
                &[
                    ("MONOSEQ_NAMED_URL", url.to_owned()),
                    ("MONOSEQ_NAMED_MILLIS", millis.to_string()),
                    ("MONOSEQ_NAMED_TIMEOUT_MS", timeout_ms.to_string()),
                ],
            )
        })
        .collect()
}

fn collect(workers: Vec<Child>) -> Outcome {
    let mut outcome = Outcome {
        values: Vec::new(),
        errors: Vec::new(),
    };
    for worker in workers {
        let output = worker.wait_with_output().unwrap();
        assert!(output.status.success(), "a worker failed");
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            match line.split_once(' ') {
                Some(("v", value)) => outcome.values.push(value.parse().unwrap()),
                Some(("e", code)) => outcome.errors.push(code.to_owned()),
                _ => panic!("unexpected worker line {line:?}"),
            }
        }
    }
    outcome
}

fn assert_unique(values: &[u64]) -> BTreeSet<u64> {
    let mut seen = BTreeSet::new();
    for &value in values {
        assert!(seen.insert(value), "{value} was handed out twice");
    }
    seen
}

fn client_next(url: &str) -> Result<u64, monoseq_client::SequencesError> {
    runtime().block_on(async {
        Client::new(url)
            .unwrap()
            .next(&ADDRESS.parse().unwrap(), &NextOptions::new())
            .await
    })
}

fn processes_share_one_sequence_without_duplicates_or_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = ServerProcess::start(dir.path(), port);
    let url = format!("http://127.0.0.1:{port}");
    let outcome = collect(start_workers(&url, 3000, 10_000));
    assert!(outcome.errors.is_empty(), "failures: {:?}", outcome.errors);
    let seen = assert_unique(&outcome.values);
    let count = seen.len() as u64;
    assert!(count > 100, "only {count} numbers in 3 s");
    assert_eq!(seen, (1..=count).collect(), "gapless from 1");
    assert_eq!(client_next(&url).unwrap(), count + 1);
    println!(
        "  {count} numbers from {PROCESSES} processes × {TASKS_PER_PROCESS} tasks in 3 s, \
         unique and gapless"
    );
    drop(server);
}

fn a_server_killed_mid_operation_restarts_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let server = ServerProcess::start(dir.path(), port);
    let workers = start_workers(&url, 3000, 2000);
    std::thread::sleep(Duration::from_millis(1000));
    server.kill();
    std::thread::sleep(Duration::from_millis(300));
    let server = ServerProcess::start(dir.path(), port);
    let outcome = collect(workers);
    let seen = assert_unique(&outcome.values);
    assert!(
        outcome.errors.iter().all(|e| e == "transport"),
        "{:?}",
        outcome.errors
    );
    let after = client_next(&url).unwrap();
    let max = *seen.last().expect("numbers were handed out");
    assert!(after > max, "the sequence went on: {after} after {max}");
    println!(
        "  {} numbers, {} failed calls while the server was down, next after restart {after}",
        seen.len(),
        outcome.errors.len()
    );
    drop(server);
}

fn a_server_stopped_longer_than_any_timeout_resumes_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let server = ServerProcess::start(dir.path(), port);
    // Operation timeout 300 ms, so each request gives up after 2.3 s; the stop lasts 3 s.
    let workers = start_workers(&url, 4500, 300);
    std::thread::sleep(Duration::from_millis(700));
    signal(&server.child, "STOP");
    std::thread::sleep(Duration::from_millis(3000));
    signal(&server.child, "CONT");
    let outcome = collect(workers);
    let seen = assert_unique(&outcome.values);
    assert!(!outcome.errors.is_empty(), "the stop was not noticed");
    assert!(
        outcome
            .errors
            .iter()
            .all(|e| e == "transport" || e == "busy"),
        "{:?}",
        outcome.errors
    );
    let after = client_next(&url).unwrap();
    assert!(after > *seen.last().unwrap());
    println!(
        "  {} numbers, {} calls timed out during the stop, next after resume {after}",
        seen.len(),
        outcome.errors.len()
    );
    drop(server);
}

/// Starts an S3 caller and waits until it has read the sequence and is about to write.
fn s3_caller_at_its_write(
    endpoint: &str,
    bucket: &str,
    pause_ms: u64,
    timeout_ms: u64,
) -> (Child, mpsc::Receiver<String>) {
    let mut caller = child(
        "s3-caller",
        &[
            ("MONOSEQ_S3_ENDPOINT", endpoint.to_owned()),
            ("MONOSEQ_NAMED_BUCKET", bucket.to_owned()),
            ("MONOSEQ_NAMED_PAUSE_MS", pause_ms.to_string()),
            ("MONOSEQ_NAMED_TIMEOUT_MS", timeout_ms.to_string()),
        ],
    );
    let out = lines(caller.stdout.take().unwrap());
    expect_line(&out, "read");
    (caller, out)
}

fn s3_next(sequences: &Sequences) -> Result<u64, NextError> {
    runtime().block_on(sequences.next(&ADDRESS.parse().unwrap(), &NextOptions::new()))
}

fn s3_callers_stopped_or_killed_between_read_and_write_cannot_duplicate() {
    let endpoint = moto::endpoint();
    let bucket = moto::unique_bucket("processes");
    moto::create_bucket(&bucket);
    let here = Sequences::new(Arc::new(s3_backend(endpoint, &bucket)));
    let mut handed = vec![s3_next(&here).unwrap()];
    assert_eq!(handed, [1]);

    // 1. Stopped between read and write, then resumed within its timeout: its write, based
    //    on a stale read, is refused; it reads again and hands out a fresh number.
    let (caller, out) = s3_caller_at_its_write(endpoint, &bucket, 500, 30_000);
    signal(&caller, "STOP");
    for _ in 0..5 {
        handed.push(s3_next(&here).unwrap());
    }
    signal(&caller, "CONT");
    expect_line(&out, "writing");
    expect_line(&out, "refused");
    expect_line(&out, "read");
    expect_line(&out, "writing");
    expect_line(&out, "written");
    let line = out.recv_timeout(READY_TIMEOUT).unwrap();
    handed.push(line.strip_prefix("v ").unwrap().parse().unwrap());
    assert_eq!(caller.wait_with_output().unwrap().status.code(), Some(0));

    // 2. Stopped for longer than its timeout (400 ms): it gives up busy, writes nothing.
    let (caller, out) = s3_caller_at_its_write(endpoint, &bucket, 250, 400);
    signal(&caller, "STOP");
    for _ in 0..5 {
        handed.push(s3_next(&here).unwrap());
    }
    std::thread::sleep(Duration::from_millis(500));
    signal(&caller, "CONT");
    let mut rest: Vec<String> = Vec::new();
    while let Ok(line) = out.recv_timeout(READY_TIMEOUT) {
        rest.push(line);
    }
    assert_eq!(rest.last().map(String::as_str), Some("e busy"), "{rest:?}");
    assert!(!rest.iter().any(|l| l == "written"), "{rest:?}");

    // 3. Killed between read and write: nothing is left behind, the next caller goes on at
    //    once (a lock would block it until its TTL ran out).
    let (mut caller, _out) = s3_caller_at_its_write(endpoint, &bucket, 500, 30_000);
    caller.kill().unwrap();
    caller.wait().unwrap();
    // Its timeout (5 s) is far shorter than a lock's TTL would be (the caller's 30 s).
    handed.push(s3_next(&here).expect("the sequence is not stuck"));

    // 4. Killed while its write is in flight: it may or may not have landed (a gap), never a
    //    duplicate.
    let (mut caller, out) = s3_caller_at_its_write(endpoint, &bucket, 0, 30_000);
    expect_line(&out, "writing");
    caller.kill().unwrap();
    caller.wait().unwrap();
    for _ in 0..3 {
        handed.push(s3_next(&here).unwrap());
    }
    let seen = assert_unique(&handed);
    // Gapless up to the caller killed mid-write (whose write may have landed).
    assert_eq!(
        seen.iter().take(13).copied().collect::<Vec<_>>(),
        (1..=13).collect::<Vec<u64>>()
    );
    println!("  handed out {handed:?}");
}

fn main() {
    match std::env::var(ROLE_VAR).as_deref() {
        Ok("server") => return run_server(),
        Ok("worker") => return run_worker(),
        Ok("s3-caller") => return run_s3_caller(),
        Ok(other) => panic!("unknown role {other}"),
        Err(_) => {}
    }
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let tests: [(&str, fn()); 4] = [
        (
            "processes_share_one_sequence_without_duplicates_or_gaps",
            processes_share_one_sequence_without_duplicates_or_gaps,
        ),
        (
            "a_server_killed_mid_operation_restarts_without_duplicates",
            a_server_killed_mid_operation_restarts_without_duplicates,
        ),
        (
            "a_server_stopped_longer_than_any_timeout_resumes_without_duplicates",
            a_server_stopped_longer_than_any_timeout_resumes_without_duplicates,
        ),
        (
            "s3_callers_stopped_or_killed_between_read_and_write_cannot_duplicate",
            s3_callers_stopped_or_killed_between_read_and_write_cannot_duplicate,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        println!("test {name} ...");
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
