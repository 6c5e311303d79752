//! Tests that need a second process: crash recovery (a child writes numbered batches and is
//! killed with SIGKILL at random moments; the parent reopens and checks that no batch is half
//! visible and nothing acknowledged as durable is lost) and the data-directory lock across
//! processes. This file is its own harness (`harness = false`) because the test binary is also
//! the child: run with `MONOSEQ_KV_CHILD` set, it plays the child's part instead.

use std::io::{BufRead, BufReader, Write};
use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use monoseq_kv::{Durability, Key, KvStore, OpenError, Options, Order, WriteBatch};

const CHILD_VAR: &str = "MONOSEQ_KV_CHILD";
/// Entries of partition `log` per batch.
const ENTRIES_PER_BATCH: u64 = 8;
/// Kill rounds per engine and durability.
const ROUNDS: u32 = 4;
const KILL_DELAY_MS_MIN: u64 = 20;
const KILL_DELAY_MS_MAX: u64 = 250;
/// How many group-commit delays a child waits before it counts an unsynced batch as flushed
/// by the background flusher (generous: a flush on a busy disk can take many milliseconds).
const FLUSHER_WAIT_DELAYS: u32 = 15;
/// Longest wait for a child to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug)]
enum Engine {
    #[cfg(feature = "fjall")]
    Fjall,
    #[cfg(feature = "redb")]
    Redb,
}

impl Engine {
    const ALL: &[Engine] = &[
        #[cfg(feature = "fjall")]
        Engine::Fjall,
        #[cfg(feature = "redb")]
        Engine::Redb,
    ];

    fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "fjall")]
            Engine::Fjall => "fjall",
            #[cfg(feature = "redb")]
            Engine::Redb => "redb",
        }
    }

    fn from_name(name: &str) -> Engine {
        *Engine::ALL
            .iter()
            .find(|e| e.name() == name)
            .unwrap_or_else(|| panic!("unknown engine {name}"))
    }

    fn open(self, dir: &Path, durability: Durability) -> Result<Box<dyn KvStore>, OpenError> {
        let options = Options::default()
            .durability(durability)
            .cache_bytes(4 << 20);
        Ok(match self {
            #[cfg(feature = "fjall")]
            Engine::Fjall => Box::new(monoseq_kv::FjallStore::open(dir, options)?),
            #[cfg(feature = "redb")]
            Engine::Redb => Box::new(monoseq_kv::RedbStore::open(dir, options)?),
        })
    }
}

fn durability_named(name: &str) -> Durability {
    match name {
        "sync" => Durability::Sync,
        "group" => Durability::GroupCommit {
            max_delay: Duration::from_millis(5),
        },
        other => panic!("unknown durability {other}"),
    }
}

fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

fn log_clustering(batch: u64, entry: u64) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[..8].copy_from_slice(&be(batch));
    c[8..].copy_from_slice(&be(entry));
    c
}

fn log_value(batch: u64, entry: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(120);
    while v.len() < 120 {
        v.extend_from_slice(&be(batch ^ (entry << 48)));
    }
    v
}

/// The last batch number stored (`None`: no batch yet).
fn last_batch(store: &dyn KvStore) -> Option<u64> {
    store
        .get(Key::new(b"meta", b"last"))
        .expect("read meta/last")
        .map(|v| u64::from_be_bytes(v.as_slice().try_into().expect("8-byte counter")))
}

/// Child: appends numbered batches forever, printing `durable N` once batches up to N are
/// acknowledged as durable: every batch under `Sync`; under group commit, every fifth batch
/// after a `sync`, and every eleventh after waiting for the background flusher.
fn child_writer(engine: Engine, durability_name: &str, dir: &Path) {
    let durability = durability_named(durability_name);
    let store = engine.open(dir, durability).expect("child opens the store");
    let mut n = last_batch(&*store).map_or(0, |last| last + 1);
    let mut out = std::io::stdout();
    writeln!(out, "ready {n}").expect("stdout");
    let mut batch = WriteBatch::new();
    loop {
        batch.clear();
        // Spread over three partitions, with conditional inserts: all or nothing after a crash.
        for entry in 0..ENTRIES_PER_BATCH {
            batch.put(
                Key::new(b"log", &log_clustering(n, entry)),
                &log_value(n, entry),
            );
        }
        batch.insert_if_absent(Key::new(b"marker", &be(n)), &be(n));
        batch.put(Key::new(b"meta", b"last"), &be(n));
        store.write(&batch).expect("child write");
        let durable = match durability {
            Durability::GroupCommit { .. } if n % 5 == 4 => {
                store.sync().expect("child sync");
                true
            }
            Durability::GroupCommit { max_delay } if n % 11 == 10 => {
                // No sync: the background flusher must have flushed it by now.
                std::thread::sleep(max_delay * FLUSHER_WAIT_DELAYS);
                true
            }
            Durability::GroupCommit { .. } => false,
            _ => true,
        };
        if durable {
            writeln!(out, "durable {n}").expect("stdout");
        }
        n += 1;
    }
}

/// Child: holds the store open until killed.
fn child_holder(engine: Engine, dir: &Path) {
    let _store = engine
        .open(dir, Durability::Sync)
        .expect("holder opens the store");
    println!("ready");
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn spawn_child(role: &str, engine: Engine, durability: &str, dir: &Path) -> Child {
    Command::new(std::env::current_exe().expect("test binary path"))
        .env(
            CHILD_VAR,
            format!("{role}:{}:{durability}:{}", engine.name(), dir.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child")
}

/// Forwards the child's stdout lines to a channel.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn wait_ready(lines: &mpsc::Receiver<String>) {
    let line = lines
        .recv_timeout(READY_TIMEOUT)
        .expect("child did not get ready");
    assert!(line.starts_with("ready"), "child said {line:?}");
}

/// A small deterministic generator, so that a failure can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Checks the store after a crash; returns the last batch stored.
fn check_recovered(store: &dyn KvStore, durable: Option<u64>, context: &str) -> Option<u64> {
    let last = last_batch(store);
    if let Some(durable) = durable {
        assert!(
            last.is_some_and(|last| last >= durable),
            "{context}: batch {durable} was acknowledged as durable but the store ends at {last:?}"
        );
    }
    // The log holds exactly the entries of batches 0..=last, each batch whole.
    let mut expected = (0u64, 0u64);
    let mut seen = 0u64;
    store
        .scan(
            b"log",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |clustering, value| {
                let batch = u64::from_be_bytes(clustering[..8].try_into().expect("batch"));
                let entry = u64::from_be_bytes(clustering[8..].try_into().expect("entry"));
                assert_eq!(
                    (batch, entry),
                    expected,
                    "{context}: log entry out of sequence (a batch is half visible or missing)"
                );
                assert_eq!(value, log_value(batch, entry), "{context}: wrong value");
                expected = if entry + 1 == ENTRIES_PER_BATCH {
                    (batch + 1, 0)
                } else {
                    (batch, entry + 1)
                };
                seen += 1;
                ControlFlow::Continue(())
            },
        )
        .expect("scan log");
    let batches = last.map_or(0, |last| last + 1);
    assert_eq!(
        seen,
        batches * ENTRIES_PER_BATCH,
        "{context}: the log and meta/last disagree (a batch is half visible)"
    );
    let mut markers = 0u64;
    store
        .scan(
            b"marker",
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |clustering, value| {
                assert_eq!(clustering, be(markers), "{context}: marker out of sequence");
                assert_eq!(value, be(markers));
                markers += 1;
                ControlFlow::Continue(())
            },
        )
        .expect("scan markers");
    assert_eq!(
        markers, batches,
        "{context}: markers and meta/last disagree"
    );
    last
}

fn batch_is_never_half_visible_and_durable_batches_survive_sigkill(
    engine: Engine,
    durability: &str,
    seed: u64,
) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut rng = Rng(seed | 1);
    let mut durable_so_far: Option<u64> = None;
    let mut progressed = 0;
    for round in 0..ROUNDS {
        let context = format!(
            "{} {durability} round {round} (seed {seed}, replay with MONOSEQ_KV_SEED={seed})",
            engine.name()
        );
        let mut child = spawn_child("writer", engine, durability, dir.path());
        let lines = lines_of(&mut child);
        wait_ready(&lines);
        let delay = KILL_DELAY_MS_MIN + rng.below(KILL_DELAY_MS_MAX - KILL_DELAY_MS_MIN);
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().expect("SIGKILL the child");
        child.wait().expect("reap the child");
        // Lines the child printed before it died are still in the pipe.
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if let Some(n) = line.strip_prefix("durable ") {
                let n: u64 = n.parse().expect("batch number");
                durable_so_far = Some(durable_so_far.map_or(n, |d| d.max(n)));
            }
        }
        let store = engine
            .open(dir.path(), Durability::Sync)
            .unwrap_or_else(|e| panic!("{context}: reopen after the crash failed: {e}"));
        let last = check_recovered(&*store, durable_so_far, &context);
        println!(
            "  {} {durability} round {round}: killed after {delay} ms, recovered through batch \
             {last:?}, durable through {durable_so_far:?}",
            engine.name()
        );
        if last.is_some_and(|l| l > 0) {
            progressed += 1;
        }
    }
    assert!(
        progressed > 0,
        "the child never got a batch written; the test checked nothing"
    );
}

fn a_second_process_cannot_open_a_locked_directory(engine: Engine) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut holder = spawn_child("holder", engine, "sync", dir.path());
    let lines = lines_of(&mut holder);
    wait_ready(&lines);
    match engine.open(dir.path(), Durability::Sync) {
        Err(OpenError::Locked { path }) => {
            assert_eq!(path, dir.path());
            let message = OpenError::Locked { path }.to_string();
            assert!(message.contains("locked"), "unclear message: {message}");
        }
        Err(other) => panic!("expected Locked, got {other}"),
        Ok(_) => panic!("a second process opened a locked data directory"),
    }
    holder.kill().expect("SIGKILL the holder");
    holder.wait().expect("reap the holder");
    // The lock dies with its process.
    let store = engine
        .open(dir.path(), Durability::Sync)
        .expect("open after the holder died");
    drop(store);
}

fn run_child(spec: &str) {
    let mut parts = spec.splitn(4, ':');
    let (role, engine, durability, dir) = (
        parts.next().unwrap_or_default(),
        Engine::from_name(parts.next().unwrap_or_default()),
        parts.next().unwrap_or_default(),
        Path::new(parts.next().unwrap_or_default()),
    );
    match role {
        "writer" => child_writer(engine, durability, dir),
        "holder" => child_holder(engine, dir),
        other => panic!("unknown child role {other}"),
    }
}

/// What the command line asks of this harness, in libtest's terms: the test names to run
/// (a test runs when its name contains one, or equals one under `--exact`; none given runs
/// all), `--list`, and `--ignored`, under which nothing runs or is listed: no test here is
/// ignored. Other flags, and the values of those that take one, are not names.
#[derive(Debug, Default)]
struct Asked {
    filter: Vec<String>,
    exact: bool,
    list: bool,
    ignored: bool,
}

impl Asked {
    fn parse(args: impl IntoIterator<Item = String>) -> Asked {
        let mut asked = Asked::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--skip" | "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" => {
                    args.next();
                }
                "--exact" => asked.exact = true,
                "--list" => asked.list = true,
                "--ignored" => asked.ignored = true,
                _ if !arg.starts_with('-') => asked.filter.push(arg),
                _ => {}
            }
        }
        asked
    }

    fn wants(&self, name: &str) -> bool {
        !self.ignored
            && (self.filter.is_empty()
                || self.filter.iter().any(|f| {
                    if self.exact {
                        name == f
                    } else {
                        name.contains(f.as_str())
                    }
                }))
    }
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD_VAR) {
        run_child(&spec);
        return;
    }
    let asked = Asked::parse(std::env::args().skip(1));
    let seed = std::env::var("MONOSEQ_KV_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    let mut tests: Vec<(String, Box<dyn Fn()>)> = Vec::new();
    for &engine in Engine::ALL {
        for durability in ["sync", "group"] {
            tests.push((
                format!(
                    "{}::{durability}::batch_is_never_half_visible_and_durable_batches_survive_sigkill",
                    engine.name()
                ),
                Box::new(move || {
                    batch_is_never_half_visible_and_durable_batches_survive_sigkill(
                        engine, durability, seed,
                    );
                }),
            ));
        }
        tests.push((
            format!(
                "{}::a_second_process_cannot_open_a_locked_directory",
                engine.name()
            ),
            Box::new(move || a_second_process_cannot_open_a_locked_directory(engine)),
        ));
    }
    if asked.list {
        // As libtest lists them (`cargo nextest` reads this).
        for (name, _) in tests.iter().filter(|(name, _)| asked.wants(name)) {
            println!("{name}: test");
        }
        return;
    }
    let (mut passed, mut failed) = (0, 0);
    println!("crash and lock tests, seed {seed}");
    for (name, test) in &tests {
        if !asked.wants(name) {
            continue;
        }
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(test)) {
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
