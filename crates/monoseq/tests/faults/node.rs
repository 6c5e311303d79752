//! One `monoseq serve` of a cluster on PostgreSQL, started directly or inside a network
//! namespace (`ip netns exec`, which replaces itself by the server: the child is the server),
//! with its log in a file the test reads.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, BIN};

/// Lease of every node of these tests, and its renewal interval.
pub const LEASE_MS: u64 = 2_000;
pub const RENEW_MS: u64 = 400;

/// Variables that would send a node's own HTTP calls (forwarding) through a proxy.
const PROXY_VARIABLES: [&str; 6] = [
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
];

pub struct Node {
    pub id: String,
    pub url: String,
    pub log: PathBuf,
    child: Child,
}

impl Node {
    /// Starts node `id` on database `db`, listening on `listen` (`ip:port`), inside network
    /// namespace `netns` when one is given; waits until it listens.
    pub fn start(netns: Option<&str>, db: &str, id: &str, listen: &str, dir: &Path) -> Node {
        let log = dir.join(format!("{id}.log"));
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, BIN]);
                c
            }
            None => Command::new(BIN),
        };
        let (lease, renew) = (LEASE_MS.to_string(), RENEW_MS.to_string());
        command
            .args(["serve", "--storage", db, "--listen", listen])
            .args(["--node-id", id, "--lease-ms", &lease])
            .args(["--lease-renew-ms", &renew])
            .args(["--partitions", &super::keyed::PARTITIONS.to_string()]);
        if !listen.starts_with("127.") {
            // A private address of the test's own network, reached by nobody else.
            command.args(["--advertise-url", &format!("http://{listen}")]);
            command.arg("--allow-unauthenticated");
        }
        for v in PROXY_VARIABLES {
            command.env_remove(v);
        }
        let mut child = command
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
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
        let url = common::listening_url(&mut child, &log);
        Node {
            id: id.to_owned(),
            url,
            log,
            child,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and the exit within `bound`.
    pub fn terminate(mut self, bound: Duration) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + bound;
        while self.child.try_wait().expect("wait").is_none() {
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
    }
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
