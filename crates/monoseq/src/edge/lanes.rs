//! Which threads serve a connection. A live tail's connection (its first request a `GET` of
//! `…/events/stream` or `…/wlog/stream`) is served by the followers' runtime, whose threads run
//! at a lower CPU priority (nice [`FOLLOWER_NICE`]); every other connection by the server's own.
//! When the machine has no CPU to spare, followers then wait and the partitions' writes do not:
//! a follower that falls behind is cut as a slow follower and resumes from its offset, while a
//! write slowed by followers would slow every client.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The followers' threads' nice value (the server's own run at the nice it was started with,
/// normally 0; the kernel gives a thread at nice 10 about a tenth of the CPU of one at 0 when
/// both want it).
pub const FOLLOWER_NICE: i32 = 10;
/// Most bytes read to find a connection's first request line.
const FIRST_LINE_BYTES_MAX: usize = 2_048;

/// The followers' threads unless `--follower-threads` says otherwise: half the machine's
/// cores, at least one.
pub fn follower_threads_default() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).max(1)
}

/// The runtime live tails are served on, with `threads` threads (`--follower-threads`; the
/// first tail starts it, and the process keeps it); `None` when it could not be started
/// (logged once; the tails then run with everything else).
pub fn followers(threads: usize) -> Option<&'static tokio::runtime::Handle> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("monoseq-follow")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()
            .inspect_err(|e| {
                tracing::warn!(
                    "cannot start the live tails' own threads ({e}); they run on the server's \
                     threads, at its priority"
                );
            })
            .ok()
    });
    runtime.as_ref().map(tokio::runtime::Runtime::handle)
}

/// Lowers the calling thread's CPU priority to [`FOLLOWER_NICE`] (never raises it).
fn lower_priority() {
    let me = rustix::thread::gettid();
    let now = rustix::process::getpriority_process(Some(me)).unwrap_or(0);
    if now >= FOLLOWER_NICE {
        return;
    }
    if let Err(e) = rustix::process::setpriority_process(Some(me), FOLLOWER_NICE) {
        tracing::debug!("lowering a follower thread's priority failed: {e}");
    }
}

/// Reads the start of a connection until its first line is in (or [`FIRST_LINE_BYTES_MAX`]
/// bytes, the end of the stream, or an error); `None` when that took longer than `wait`.
pub async fn first_line<S: AsyncRead + Unpin>(io: &mut S, wait: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::with_capacity(FIRST_LINE_BYTES_MAX);
    let read = async {
        while !got.contains(&b'\n') && got.len() < FIRST_LINE_BYTES_MAX {
            match io.read_buf(&mut got).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(wait, read).await.ok()?;
    Some(got)
}

/// Whether a request line asks for a live tail (`GET` of a path ending `/events/stream` or
/// `/wlog/stream`).
pub fn is_tail(line: &[u8]) -> bool {
    let mut words = line.split(|b| *b == b' ');
    if words.next() != Some(b"GET".as_slice()) {
        return false;
    }
    let Some(target) = words.next() else {
        return false;
    };
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    path.ends_with(b"/events/stream") || path.ends_with(b"/wlog/stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_get_of_a_stream_path_is_a_tail() {
        assert!(is_tail(b"GET /v1/partitions/3/events/stream HTTP/1.1\r\n"));
        assert!(is_tail(
            b"GET /v1/partitions/3/events/stream?from=7 HTTP/1.1\r\n"
        ));
        assert!(is_tail(
            b"GET /v1/workspaces/9/wlog/stream?from=1 HTTP/1.1\r\n"
        ));
        assert!(!is_tail(b"GET /v1/partitions/3/events?from=7 HTTP/1.1\r\n"));
        assert!(!is_tail(
            b"POST /v1/partitions/3/events/stream HTTP/1.1\r\n"
        ));
        assert!(!is_tail(
            b"GET /v1/partitions/3/events?from=1&x=/events/stream HTTP/1.1\r\n"
        ));
        assert!(!is_tail(b"GET"));
        assert!(!is_tail(b""));
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_has_no_first_line() {
        let (mut ours, _theirs) = tokio::io::duplex(64);
        assert!(
            first_line(&mut ours, Duration::from_millis(20))
                .await
                .is_none()
        );
    }
}
