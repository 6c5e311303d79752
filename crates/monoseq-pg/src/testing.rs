//! Test support (feature `testing`): [`PgCluster`], a private PostgreSQL server in a temporary
//! directory, started with the installed binaries (`initdb`, `pg_ctl`), listening on a free
//! port of 127.0.0.1 with `fsync` on, and removed when dropped or when the test process ends.
//! Owns the rule that a missing PostgreSQL installation fails the test with instructions,
//! never skips it. [`PgPair`] (`pair.rs`) adds a synchronous standby for failover tests.

use std::fmt;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use tempfile::TempDir;

use crate::{PgOptions, PgStore};

mod pair;

pub use pair::PgPair;

/// The superuser of a test cluster.
pub const SUPERUSER: &str = "postgres";
/// Its password (connections over TCP authenticate with SCRAM, as in production).
pub const PASSWORD: &str = "monoseq-test-password";
/// The database every test cluster creates for the stores of [`PgCluster::fresh_store`].
pub const DATABASE: &str = "monoseq";
/// Attempts to start a new cluster when the free port found was taken before the server bound
/// it.
const START_ATTEMPTS_MAX: u32 = 3;
/// Longest wait of `pg_ctl` for the server to start or stop, in seconds.
const PG_CTL_WAIT_SECONDS: &str = "60";
/// Environment variable naming the directory of the PostgreSQL binaries, when neither
/// `pg_config --bindir` nor `/usr/lib/postgresql/*/bin` finds them.
pub const BINDIR_ENV: &str = "MONOSEQ_PG_BINDIR";

/// A test cluster could not be set up or driven.
#[derive(Debug, Clone)]
pub struct ClusterError(String);

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClusterError {}

fn error(message: impl Into<String>) -> ClusterError {
    ClusterError(message.into())
}

/// A private PostgreSQL server for tests. Dropping it stops the server and removes its
/// directory; a watchdog process does the same if the test process dies first.
///
/// # Example
///
/// ```no_run
/// use monoseq_kv::{Key, KvStore};
/// use monoseq_pg::testing::PgCluster;
/// use monoseq_pg::PgOptions;
///
/// let cluster = PgCluster::shared()?;
/// let store = cluster.fresh_store(PgOptions::default())?;
/// store.put(Key::new(b"p", b"a"), b"1")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct PgCluster {
    /// `None` once removed.
    dir: Option<TempDir>,
    bin: PathBuf,
    port: u16,
    /// Whether the server's commands run as the `postgres` user (this process is root).
    as_postgres: bool,
    /// Serialises stop and start.
    control: Mutex<()>,
}

impl PgCluster {
    /// A new cluster of its own, with database [`DATABASE`]: for tests that stop and start
    /// the server.
    ///
    /// # Errors
    ///
    /// A [`ClusterError`] saying what to do when PostgreSQL is not installed (`apt-get install
    /// postgresql`), or what failed (with the server's log) when it does not start.
    pub fn start() -> Result<PgCluster, ClusterError> {
        let bin = bindir()?;
        let as_postgres = effective_uid()? == 0;
        let mut last = None;
        for _ in 0..START_ATTEMPTS_MAX {
            match PgCluster::start_once(&bin, as_postgres) {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| error("the test cluster did not start")))
    }

    /// The cluster shared by every test of this process (started on first use, stopped and
    /// removed when the process ends). Tests must not stop it; each takes its own schema
    /// through [`PgCluster::fresh_store`].
    ///
    /// # Errors
    ///
    /// As [`PgCluster::start`], for every call once the start failed.
    pub fn shared() -> Result<&'static PgCluster, ClusterError> {
        static SHARED: OnceLock<Result<PgCluster, ClusterError>> = OnceLock::new();
        SHARED
            .get_or_init(PgCluster::start)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn start_once(bin: &Path, as_postgres: bool) -> Result<PgCluster, ClusterError> {
        let cluster = PgCluster::prepared(bin, as_postgres)?;
        cluster.init()?;
        cluster.start_server()?;
        cluster.psql("postgres", &format!("CREATE DATABASE {DATABASE}"))?;
        Ok(cluster)
    }

    /// A cluster's directory (with its socket directory, owned by the server's user), a free
    /// port and the cleanup watchdog; no data directory yet.
    fn prepared(bin: &Path, as_postgres: bool) -> Result<PgCluster, ClusterError> {
        let dir = tempfile::Builder::new()
            .prefix("monoseq-pg-")
            .tempdir()
            .map_err(|e| error(format!("cannot create a temporary directory: {e}")))?;
        let port = free_port()?;
        let cluster = PgCluster {
            dir: Some(dir),
            bin: bin.to_path_buf(),
            port,
            as_postgres,
            control: Mutex::new(()),
        };
        cluster.watch_for_exit()?;
        let socket = cluster.socket_dir()?;
        std::fs::create_dir(&socket)
            .map_err(|e| error(format!("cannot create {}: {e}", socket.display())))?;
        cluster.give_to_server_user(&[cluster.dir()?, &socket])?;
        Ok(cluster)
    }

    /// Makes `paths` owned by the `postgres` user when the server's commands run as it.
    fn give_to_server_user(&self, paths: &[&Path]) -> Result<(), ClusterError> {
        if !self.as_postgres {
            return Ok(());
        }
        let (uid, gid) = (id_of("-u")?, id_of("-g")?);
        for path in paths {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| error(format!("cannot chown {}: {e}", path.display())))?;
        }
        Ok(())
    }

    /// The server's settings for this cluster's port and socket, appended to its
    /// `postgresql.conf` (later lines win).
    fn append_config(&self, extra: &str) -> Result<(), ClusterError> {
        let config = format!(
            "\n# monoseq test cluster\nport = {}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nfsync = on\nsynchronous_commit = on\n\
             max_connections = 200\n{extra}",
            self.port,
            self.socket_dir()?.display()
        );
        let conf = self.data_dir()?.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf)
            .map_err(|e| error(format!("cannot read {}: {e}", conf.display())))?;
        text.push_str(&config);
        std::fs::write(&conf, text)
            .map_err(|e| error(format!("cannot write {}: {e}", conf.display())))
    }

    fn dir(&self) -> Result<&Path, ClusterError> {
        self.dir
            .as_ref()
            .map(TempDir::path)
            .ok_or_else(|| error("the test cluster was removed"))
    }

    /// The data directory.
    ///
    /// # Errors
    ///
    /// When the cluster was removed.
    pub fn data_dir(&self) -> Result<PathBuf, ClusterError> {
        Ok(self.dir()?.join("data"))
    }

    fn socket_dir(&self) -> Result<PathBuf, ClusterError> {
        Ok(self.dir()?.join("socket"))
    }

    /// The TCP port the server listens on (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection string to `database` as the superuser, over TCP with a password.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// A new store in a schema of its own in database [`DATABASE`] (the `schema` of `options`
    /// is replaced by a fresh name): isolated from every other store of the cluster.
    ///
    /// # Errors
    ///
    /// When the store does not open.
    pub fn fresh_store(&self, options: PgOptions) -> Result<PgStore, ClusterError> {
        PgStore::open(&self.url(DATABASE), options.schema(fresh_name("s")))
            .map_err(|e| error(format!("opening a store on the test cluster failed: {e}")))
    }

    /// A new, empty database; answers its connection string.
    ///
    /// # Errors
    ///
    /// When `CREATE DATABASE` fails.
    pub fn create_database(&self) -> Result<String, ClusterError> {
        let name = fresh_name("db");
        self.psql("postgres", &format!("CREATE DATABASE {name}"))?;
        Ok(self.url(&name))
    }

    /// Runs `sql` in `database` with `psql` as the superuser (over the cluster's socket);
    /// answers what it printed (unaligned, tuples only).
    ///
    /// # Errors
    ///
    /// When `psql` fails, with its output.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String, ClusterError> {
        let socket = self.socket_dir()?;
        let mut command = Command::new(self.bin.join("psql"));
        command
            .arg("-X")
            .arg("-q")
            .arg("-A")
            .arg("-t")
            .args(["-v", "ON_ERROR_STOP=1"])
            .arg("-h")
            .arg(&socket)
            .args(["-p", &self.port.to_string()])
            .args(["-U", SUPERUSER, "-d", database, "-c", sql]);
        let output = command
            .stdin(Stdio::null())
            .output()
            .map_err(|e| error(format!("cannot run psql: {e}")))?;
        if !output.status.success() {
            return Err(error(format!(
                "psql failed on {sql:?}: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// Stops the server (fast shutdown: connections are closed, the data stays).
    ///
    /// # Errors
    ///
    /// When `pg_ctl stop` fails.
    pub fn stop_server(&self) -> Result<(), ClusterError> {
        let _serial = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let data = self.data_dir()?;
        self.pg_ctl(
            &["stop", "-m", "fast", "-w", "-t", PG_CTL_WAIT_SECONDS, "-D"],
            &data,
        )
    }

    /// Stops the server the way a crash would (immediate shutdown: no checkpoint, recovery
    /// from the write-ahead log at the next start).
    ///
    /// # Errors
    ///
    /// When `pg_ctl stop` fails.
    pub fn crash_server(&self) -> Result<(), ClusterError> {
        let _serial = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let data = self.data_dir()?;
        self.pg_ctl(
            &[
                "stop",
                "-m",
                "immediate",
                "-w",
                "-t",
                PG_CTL_WAIT_SECONDS,
                "-D",
            ],
            &data,
        )
    }

    /// Starts the server again (or the first time), waiting until it accepts connections.
    ///
    /// # Errors
    ///
    /// When it does not start, with the end of the server's log.
    pub fn start_server(&self) -> Result<(), ClusterError> {
        let _serial = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let data = self.data_dir()?;
        let log = self.dir()?.join("server.log");
        let started = self.pg_ctl(
            &[
                "start",
                "-w",
                "-t",
                PG_CTL_WAIT_SECONDS,
                "-l",
                &log.to_string_lossy(),
                "-D",
            ],
            &data,
        );
        started.map_err(|e| {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            error(format!("{e}\nserver log:\n{}", tail.join("\n")))
        })
    }

    /// Takes a base backup of the running server, as an operator's `pg_basebackup` (with the
    /// write-ahead log it needs), into the directory `name` beside the data directory; its
    /// path. [`PgCluster::restore`] brings it back.
    ///
    /// # Errors
    ///
    /// When `pg_basebackup` fails.
    pub fn base_backup(&self, name: &str) -> Result<PathBuf, ClusterError> {
        let to = self.dir()?.join(name);
        let args = [
            "-D",
            &to.to_string_lossy(),
            "-h",
            &self.socket_dir()?.to_string_lossy(),
            "-p",
            &self.port.to_string(),
            "-U",
            SUPERUSER,
            "-X",
            "stream",
            "-c",
            "fast",
        ]
        .map(String::from);
        self.run("pg_basebackup", &args)?;
        Ok(to)
    }

    /// Restores a base backup taken by [`PgCluster::base_backup`], as an operator would after
    /// losing the server: the server is stopped the way a crash would, its data directory is
    /// replaced by the backup, and it is started again on the same port. Everything written
    /// after the backup is gone.
    ///
    /// # Errors
    ///
    /// When the server does not stop or start, or the directories cannot be swapped.
    pub fn restore(&self, backup: &Path) -> Result<(), ClusterError> {
        self.crash_server()?;
        let data = self.data_dir()?;
        let replaced = self.dir()?.join("data.replaced");
        std::fs::rename(&data, &replaced)
            .map_err(|e| error(format!("cannot move {} aside: {e}", data.display())))?;
        std::fs::rename(backup, &data).map_err(|e| {
            error(format!(
                "cannot move {} to {}: {e}",
                backup.display(),
                data.display()
            ))
        })?;
        self.start_server()
    }

    fn init(&self) -> Result<(), ClusterError> {
        let dir = self.dir()?;
        let password_file = dir.join("password");
        std::fs::write(&password_file, PASSWORD)
            .map_err(|e| error(format!("cannot write {}: {e}", password_file.display())))?;
        self.give_to_server_user(&[&password_file])?;
        let data = self.data_dir()?;
        let mut args: Vec<String> = vec!["-D".into(), data.to_string_lossy().into_owned()];
        args.extend(
            [
                "-U",
                SUPERUSER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
                // Only initdb's own files skip fsync; the server runs with fsync on.
                "--no-sync",
            ]
            .map(String::from),
        );
        args.push(format!("--pwfile={}", password_file.display()));
        self.run("initdb", &args)?;
        self.append_config("")
    }

    fn pg_ctl(&self, args: &[&str], data: &Path) -> Result<(), ClusterError> {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.push(data.to_string_lossy().into_owned());
        self.run("pg_ctl", &all)
    }

    /// Runs one of the server's binaries, as `postgres` when this process is root.
    fn run(&self, program: &str, args: &[String]) -> Result<(), ClusterError> {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let output = command
            .args(args)
            .current_dir(self.dir()?)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| error(format!("cannot run {}: {e}", path.display())))?;
        if output.status.success() {
            return Ok(());
        }
        Err(error(format!(
            "{program} {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout).trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }

    /// Starts a detached process that stops the server and removes the directory once this
    /// process is gone (a `static` cluster is never dropped).
    fn watch_for_exit(&self) -> Result<(), ClusterError> {
        let dir = self.dir()?.to_string_lossy().into_owned();
        if dir.contains('\'') {
            return Err(error(format!("unexpected quote in temporary path {dir}")));
        }
        let pg_ctl = self.bin.join("pg_ctl").to_string_lossy().into_owned();
        let run_as = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; \
             {run_as}'{pg_ctl}' stop -D '{dir}/data' -m immediate >/dev/null 2>&1; \
             rm -rf '{dir}'",
            pid = std::process::id()
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(drop)
            .map_err(|e| error(format!("cannot start the cleanup watchdog: {e}")))
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Ok(data) = self.data_dir() {
            let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-D"], &data);
        }
        drop(self.dir.take());
    }
}

/// A name no other call of this process or of a concurrent one gives.
fn fresh_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A TCP port of 127.0.0.1 that nothing listens on right now.
///
/// # Errors
///
/// When no port can be bound.
pub fn free_port() -> Result<u16, ClusterError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| error(format!("cannot find a free port: {e}")))
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn effective_uid() -> Result<u32, ClusterError> {
    command_output("id", &["-u"])
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| error("cannot find this process's user id (`id -u`)"))
}

fn id_of(flag: &str) -> Result<u32, ClusterError> {
    command_output("id", &[flag, "postgres"])
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            error(
                "this process runs as root and PostgreSQL refuses to, but there is no `postgres` \
                 user to run it as: install PostgreSQL with `apt-get install postgresql`, which \
                 creates it",
            )
        })
}

/// The directory of `initdb`, `pg_ctl` and `psql`.
fn bindir() -> Result<PathBuf, ClusterError> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    let given = std::env::var_os(BINDIR_ENV).map(PathBuf::from);
    let configured = || command_output("pg_config", &["--bindir"]).map(PathBuf::from);
    if let Some(dir) = given.filter(|d| has_initdb(d)) {
        return Ok(dir);
    }
    if let Some(dir) = configured().filter(|d| has_initdb(d)) {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let dir = entry.path().join("bin");
            has_initdb(&dir).then_some((version, dir))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir).ok_or_else(|| {
        error(format!(
            "PostgreSQL is not installed (no initdb and pg_ctl found through {BINDIR_ENV}, \
             `pg_config --bindir` or /usr/lib/postgresql/*/bin): install it with \
             `apt-get install postgresql` (Debian) and run the tests again"
        ))
    })
}
