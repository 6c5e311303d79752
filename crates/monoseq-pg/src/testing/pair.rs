//! [`PgPair`]: a primary PostgreSQL server with a synchronous streaming standby on this
//! machine, for tests of the database's own failover: kill the primary the way a machine dies,
//! promote the standby, and reach whichever is writable through one multi-host connection
//! string. Owns the order of the setup (the primary commits alone until the standby streams,
//! and only then waits for it).

use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::{ClusterError, PASSWORD, PG_CTL_WAIT_SECONDS, PgCluster, SUPERUSER, error};

/// Longest wait for the standby to stream, for a promotion, or for the killed primary's
/// processes to be gone.
const PAIR_WAIT: Duration = Duration::from_secs(60);
/// Pause between two looks at a server's state.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A primary with one synchronous streaming standby, each a private cluster on its own port
/// of 127.0.0.1 (removed when dropped or when the test process ends, as [`PgCluster`]).
///
/// The primary runs with `synchronous_standby_names = '*'` and `synchronous_commit = on`: a
/// commit returns only once the standby confirmed that its write-ahead log is flushed, so
/// every acknowledged write survives the primary's death. The flip side: while no standby is
/// connected, commits on the primary wait (they do not fail), until the standby is back or the
/// client gives up (the store's statement timeout; the transaction then stays committed on the
/// primary alone, an unknown outcome for the caller).
///
/// # Example
///
/// ```no_run
/// use monoseq_kv::{Key, KvStore};
/// use monoseq_pg::testing::{DATABASE, PgPair};
/// use monoseq_pg::{PgOptions, PgStore};
///
/// let pair = PgPair::start()?;
/// let store = PgStore::open(&pair.url(DATABASE), PgOptions::default())?;
/// store.put(Key::new(b"p", b"a"), b"1")?;
/// pair.kill_primary()?;
/// pair.promote_standby()?;
/// // The store reconnects to the promoted standby by itself.
/// assert_eq!(store.get(Key::new(b"p", b"a"))?, Some(b"1".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PgPair {
    primary: PgCluster,
    standby: PgCluster,
}

impl PgPair {
    /// Starts the primary (with database [`DATABASE`](super::DATABASE)), makes the standby from a base backup
    /// of it (`pg_basebackup -R`), starts it, waits until it streams, and only then makes the
    /// primary's commits wait for it.
    ///
    /// # Errors
    ///
    /// As [`PgCluster::start`], or when the backup, the standby or the replication does not
    /// come up (with what failed).
    pub fn start() -> Result<PgPair, ClusterError> {
        let primary = PgCluster::start()?;
        let standby = PgCluster::prepared(&primary.bin, primary.as_postgres)?;
        let data = standby.data_dir()?.to_string_lossy().into_owned();
        let args = [
            "-D",
            &data,
            "-h",
            &primary.socket_dir()?.to_string_lossy(),
            "-p",
            &primary.port.to_string(),
            "-U",
            SUPERUSER,
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            "--no-sync",
        ]
        .map(String::from);
        standby.run("pg_basebackup", &args)?;
        // The copied settings name the primary's port and socket; later lines win.
        standby.append_config("hot_standby = on\n")?;
        standby.start_server()?;
        wait_until(
            &primary,
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
        )?;
        primary.psql(
            "postgres",
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
        )?;
        primary.psql("postgres", "SELECT pg_reload_conf()")?;
        wait_until(
            &primary,
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        )?;
        Ok(PgPair { primary, standby })
    }

    /// A connection string to `database` listing both servers, that connects to whichever
    /// accepts writes (`target_session_attrs=read-write`): the primary, or the standby once
    /// promoted.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{},127.0.0.1:{}/{database}?\
             target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }

    /// The primary's cluster.
    pub fn primary(&self) -> &PgCluster {
        &self.primary
    }

    /// The standby's cluster.
    pub fn standby(&self) -> &PgCluster {
        &self.standby
    }

    /// Kills the primary the way a crash of its machine would: SIGKILL of the postmaster and
    /// of every process it started, at once (nothing is flushed or sent after it); returns
    /// once they are gone.
    ///
    /// # Errors
    ///
    /// When the server's process ID cannot be read or the processes do not end.
    pub fn kill_primary(&self) -> Result<(), ClusterError> {
        let pid_file = self.primary.data_dir()?.join("postmaster.pid");
        let text = std::fs::read_to_string(&pid_file)
            .map_err(|e| error(format!("cannot read {}: {e}", pid_file.display())))?;
        let postmaster: u32 = text
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .ok_or_else(|| error(format!("{} names no process", pid_file.display())))?;
        // Children first listed, then killed with their parent in one call.
        let mut pids = children_of(postmaster);
        pids.push(postmaster);
        // A child may end by itself in between; `kill` then fails for it alone, so its status
        // is not checked: the wait below is.
        Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| error(format!("cannot run kill: {e}")))?;
        let began = Instant::now();
        while pids.iter().any(|&pid| is_running(pid)) {
            if began.elapsed() > PAIR_WAIT {
                return Err(error(format!(
                    "the killed primary's processes {pids:?} live on"
                )));
            }
            thread::sleep(POLL_INTERVAL);
        }
        Ok(())
    }

    /// Stops the primary's WAL senders (SIGSTOP) until [`PgPair::resume_replication`], as a
    /// network partition between the servers would: the standby receives nothing more. With
    /// synchronous replication the primary's commits then wait for a confirmation that never
    /// comes; with asynchronous replication they would return, and a promoted standby would
    /// lack them.
    ///
    /// # Errors
    ///
    /// When the primary has no WAL sender or the signal fails.
    pub fn stall_replication(&self) -> Result<(), ClusterError> {
        self.signal_wal_senders("-STOP")
    }

    /// Lets the WAL senders stopped by [`PgPair::stall_replication`] run again (SIGCONT): the
    /// standby catches up and the commits that waited for it return.
    ///
    /// # Errors
    ///
    /// When the signal fails.
    pub fn resume_replication(&self) -> Result<(), ClusterError> {
        self.signal_wal_senders("-CONT")
    }

    /// Sends `signal` to every WAL sender of the primary.
    fn signal_wal_senders(&self, signal: &str) -> Result<(), ClusterError> {
        let pids = self
            .primary
            .psql("postgres", "SELECT pid FROM pg_stat_replication")?;
        if pids.is_empty() {
            return Err(error("the primary runs no WAL sender"));
        }
        let status = Command::new("kill")
            .arg(signal)
            .args(pids.lines())
            .stdin(Stdio::null())
            .status()
            .map_err(|e| error(format!("cannot run kill: {e}")))?;
        match status.success() {
            true => Ok(()),
            false => Err(error(format!("kill {signal} {pids} failed ({status})"))),
        }
    }

    /// Promotes the standby (`pg_ctl promote`) and returns once it accepts writes. It then
    /// runs alone: its commits wait for no standby.
    ///
    /// # Errors
    ///
    /// When the promotion fails or does not finish within a minute.
    pub fn promote_standby(&self) -> Result<(), ClusterError> {
        let data = self.standby.data_dir()?;
        self.standby
            .pg_ctl(&["promote", "-w", "-t", PG_CTL_WAIT_SECONDS, "-D"], &data)?;
        let began = Instant::now();
        while self
            .standby
            .psql("postgres", "SELECT pg_is_in_recovery()")?
            != "f"
        {
            if began.elapsed() > PAIR_WAIT {
                return Err(error("the promoted standby still runs recovery"));
            }
            thread::sleep(POLL_INTERVAL);
        }
        Ok(())
    }
}

/// Waits until `count_sql` answers at least 1 on `cluster`.
fn wait_until(cluster: &PgCluster, count_sql: &str) -> Result<(), ClusterError> {
    let began = Instant::now();
    loop {
        let count: u64 = cluster.psql("postgres", count_sql)?.parse().unwrap_or(0);
        if count > 0 {
            return Ok(());
        }
        if began.elapsed() > PAIR_WAIT {
            return Err(error(format!(
                "waited {PAIR_WAIT:?} in vain for the replication ({count_sql})"
            )));
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// The processes whose parent is `parent` (from `/proc`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent_of(pid) == Some(parent))
        .collect()
}

/// The parent of `pid`: the second field after the command name in `/proc/<pid>/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
fn is_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
    else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|end| stat.get(end + 1..))
        .and_then(|rest| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}
