//! The edge's settings: the `serve` flags, the settings file's `[edge]` table, and their
//! resolution into [`EdgeLimits`] over the defaults.

use std::time::Duration;

use super::lanes::{FOLLOWER_NICE, follower_threads_default};
use super::{
    BODY_READ_TIMEOUT_DEFAULT_MS, CONNECTIONS_MAX_DEFAULT, EdgeLimits,
    HEADER_READ_TIMEOUT_DEFAULT_MS, IDLE_TIMEOUT_DEFAULT_MS, REQUESTS_MAX_DEFAULT,
};

/// Most `--follower-threads`.
const FOLLOWER_THREADS_MAX: usize = 1_024;

/// The edge's flags of `serve` (each also `MONOSEQ_<NAME>`, and a key of the settings file's
/// `[edge]` table).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EdgeArgs {
    #[arg(long, env = "MONOSEQ_HEADER_READ_TIMEOUT_MS", help = format!(
        "Time for a request's head to arrive, from the connection's start or the first byte \
         after an answer; past it the connection is closed [default: \
         {HEADER_READ_TIMEOUT_DEFAULT_MS}]"))]
    pub header_read_timeout_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_BODY_READ_TIMEOUT_MS", help = format!(
        "Time for a request's body to arrive, from the request's start; past it the answer \
         is 408 body_timeout [default: {BODY_READ_TIMEOUT_DEFAULT_MS}]"))]
    pub body_read_timeout_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_IDLE_TIMEOUT_MS", help = format!(
        "A kept-alive connection without a request for this long is closed [default: \
         {IDLE_TIMEOUT_DEFAULT_MS}]"))]
    pub idle_timeout_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_CONNECTIONS_MAX", help = format!(
        "Most connections served at once; one more is answered 503 and closed [default: \
         {CONNECTIONS_MAX_DEFAULT}, fewer if the file-descriptor limit cannot hold them]"))]
    pub connections_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_REQUESTS_MAX", help = format!(
        "Most requests answered at once; one more is answered 503 overloaded [default: \
         {REQUESTS_MAX_DEFAULT}]"))]
    pub requests_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_FOLLOWER_THREADS", help = format!(
        "Threads that hand live tails their events and write them to their sockets, at a \
         lower CPU priority (nice {FOLLOWER_NICE}); the tails' reads of the store run on \
         further threads of theirs, at the same priority, one per read under way [default: \
         half the cores, at least 1; at most {FOLLOWER_THREADS_MAX}]"))]
    pub follower_threads: Option<usize>,
}

/// The settings file's `[edge]` table.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeFile {
    pub header_read_timeout_ms: Option<u64>,
    pub body_read_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub connections_max: Option<usize>,
    pub requests_max: Option<usize>,
    pub follower_threads: Option<usize>,
}

impl EdgeArgs {
    /// The limits: flags and environment over the file over the defaults.
    ///
    /// # Errors
    ///
    /// When a limit is 0.
    pub fn resolve(&self, file: &EdgeFile) -> anyhow::Result<EdgeLimits> {
        let pick = |flag: Option<u64>, file: Option<u64>, default: u64, name: &str| {
            let value = flag.or(file).unwrap_or(default);
            anyhow::ensure!(value > 0, "--{name} must be at least 1");
            Ok(value)
        };
        let as_u64 = |v: Option<usize>| v.map(|v| v as u64);
        Ok(EdgeLimits {
            header_read_timeout: Duration::from_millis(pick(
                self.header_read_timeout_ms,
                file.header_read_timeout_ms,
                HEADER_READ_TIMEOUT_DEFAULT_MS,
                "header-read-timeout-ms",
            )?),
            body_read_timeout: Duration::from_millis(pick(
                self.body_read_timeout_ms,
                file.body_read_timeout_ms,
                BODY_READ_TIMEOUT_DEFAULT_MS,
                "body-read-timeout-ms",
            )?),
            idle_timeout: Duration::from_millis(pick(
                self.idle_timeout_ms,
                file.idle_timeout_ms,
                IDLE_TIMEOUT_DEFAULT_MS,
                "idle-timeout-ms",
            )?),
            connections_max: pick(
                as_u64(self.connections_max),
                as_u64(file.connections_max),
                CONNECTIONS_MAX_DEFAULT as u64,
                "connections-max",
            )? as usize,
            requests_max: pick(
                as_u64(self.requests_max),
                as_u64(file.requests_max),
                REQUESTS_MAX_DEFAULT as u64,
                "requests-max",
            )? as usize,
            follower_threads: {
                let threads = pick(
                    as_u64(self.follower_threads),
                    as_u64(file.follower_threads),
                    follower_threads_default() as u64,
                    "follower-threads",
                )? as usize;
                anyhow::ensure!(
                    threads <= FOLLOWER_THREADS_MAX,
                    "--follower-threads is 1 to {FOLLOWER_THREADS_MAX} (got {threads})"
                );
                threads
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follower_threads_come_from_the_flag_over_the_file_and_are_1_to_1024() {
        let file = EdgeFile {
            follower_threads: Some(3),
            ..EdgeFile::default()
        };
        let limits = EdgeArgs::default().resolve(&file).unwrap();
        assert_eq!(limits.follower_threads, 3);
        let flag = EdgeArgs {
            follower_threads: Some(2),
            ..EdgeArgs::default()
        };
        assert_eq!(flag.resolve(&file).unwrap().follower_threads, 2);
        let unset = EdgeArgs::default().resolve(&EdgeFile::default()).unwrap();
        assert_eq!(unset.follower_threads, follower_threads_default());
        for (threads, refused) in [
            (0, "--follower-threads must be at least 1"),
            (1_025, "--follower-threads is 1 to 1024 (got 1025)"),
        ] {
            let args = EdgeArgs {
                follower_threads: Some(threads),
                ..EdgeArgs::default()
            };
            let err = args.resolve(&EdgeFile::default()).unwrap_err().to_string();
            assert_eq!(err, refused);
        }
    }
}
