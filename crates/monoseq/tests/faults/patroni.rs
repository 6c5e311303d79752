//! [`PatroniPair`]: a PostgreSQL primary and a synchronous standby managed by Patroni, with
//! one etcd as its store of the cluster state, all on 127.0.0.1 with free ports and a
//! temporary directory. Patroni decides who is primary: killing the primary's machine
//! (Patroni and PostgreSQL with SIGKILL) makes it promote the standby once the leader key
//! expires. [`member_yaml`] renders the configuration each member runs with; docs/cluster.md
//! shows it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use monoseq_pg::testing::free_port;

/// Longest wait for etcd to answer, a member to bootstrap or follow, or a promotion.
const WAIT: Duration = Duration::from_secs(90);
/// The superuser's password and the replication user's.
const SUPERUSER_PASSWORD: &str = "monoseq-patroni-superuser";
const REPLICATION_PASSWORD: &str = "monoseq-patroni-replication";

/// The values a member's configuration is made of.
pub struct MemberSettings<'a> {
    /// The cluster's name in etcd (Patroni's `scope`).
    pub scope: &'a str,
    pub name: &'a str,
    /// Where this member's PostgreSQL and REST API listen and are reached.
    pub host: &'a str,
    pub pg_port: u16,
    pub api_port: u16,
    /// etcd's client address (`host:port`).
    pub etcd: &'a str,
    pub data_dir: &'a str,
    pub bin_dir: &'a str,
    pub pgpass: &'a str,
    pub socket_dir: &'a str,
    /// Addresses PostgreSQL accepts password logins from (`pg_hba`).
    pub clients: &'a str,
    pub superuser_password: &'a str,
    pub replication_password: &'a str,
}

/// A member's Patroni configuration: synchronous replication (`synchronous_mode: true`: a
/// commit returns once the standby has it, and only the synchronous standby may be
/// promoted), a leader key of 10 s checked every second (a dead primary is replaced in about
/// 10 s), and `pg_rewind` for a former primary that comes back (the test does not bring it
/// back).
pub fn member_yaml(s: &MemberSettings) -> String {
    format!(
        "scope: {scope}
name: {name}
restapi:
  listen: {host}:{api_port}
  connect_address: {host}:{api_port}
etcd3:
  hosts: {etcd}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      parameters:
        synchronous_commit: 'on'
        max_connections: 200
        wal_keep_size: 256MB
  initdb:
  - encoding: UTF8
  - no-locale
  - auth-host: scram-sha-256
  - auth-local: trust
  pg_hba:
  - local all all trust
  - host replication replicator {clients} scram-sha-256
  - host all all {clients} scram-sha-256
postgresql:
  listen: {host}:{pg_port}
  connect_address: {host}:{pg_port}
  data_dir: {data_dir}
  bin_dir: {bin_dir}
  pgpass: {pgpass}
  authentication:
    superuser:
      username: postgres
      password: {superuser_password}
    replication:
      username: replicator
      password: {replication_password}
  parameters:
    unix_socket_directories: {socket_dir}
",
        scope = s.scope,
        name = s.name,
        host = s.host,
        api_port = s.api_port,
        pg_port = s.pg_port,
        etcd = s.etcd,
        data_dir = s.data_dir,
        bin_dir = s.bin_dir,
        pgpass = s.pgpass,
        socket_dir = s.socket_dir,
        clients = s.clients,
        superuser_password = s.superuser_password,
        replication_password = s.replication_password,
    )
}

/// One Patroni member: its PostgreSQL port, REST API port, data directory and process.
pub struct Member {
    pub name: String,
    pub pg_port: u16,
    pub api_port: u16,
    pub data_dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
    patroni: Option<Child>,
}

impl Member {
    /// Patroni's answer to `GET path` on this member's REST API (`/primary` answers 200 on
    /// the primary, `/sync` on the synchronous standby).
    pub fn answers(&self, path: &str) -> Option<u16> {
        http_status(self.api_port, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The PostgreSQL server's process ID (`postmaster.pid`), while it runs.
    fn postmaster(&self) -> Option<u32> {
        std::fs::read_to_string(self.data_dir.join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }
}

/// etcd and two Patroni members on loopback; dropped, every process it started is killed and
/// its directory removed (a watchdog does the same if the test process dies first).
pub struct PatroniPair {
    pub members: Vec<Member>,
    etcd: Child,
    etcd_port: u16,
    scope: String,
    dir: tempfile::TempDir,
    /// The user and group PostgreSQL and Patroni run as (`postgres` when this process is
    /// root).
    owner: Option<(u32, u32)>,
}

impl PatroniPair {
    /// Starts etcd, then member `pg1` (it bootstraps and becomes primary), then `pg2` (it
    /// clones `pg1` and becomes its synchronous standby), and creates database `database`.
    pub fn start(database: &str) -> PatroniPair {
        for program in ["patroni", "etcd"] {
            assert!(
                Command::new(program)
                    .arg("--version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok(),
                "{program} is not installed: `apt-get install patroni etcd-server` (Debian; \
                 scripts/test does)"
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("monoseq-patroni-")
            .tempdir()
            .expect("a temporary directory");
        let owner = server_user();
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown");
        }
        let scope = format!("monoseq-{}", std::process::id());
        let (etcd_port, peer_port) = (port(), port());
        let etcd = Command::new("etcd")
            .args(["--name", "e1", "--data-dir"])
            .arg(dir.path().join("etcd"))
            .args([
                "--listen-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{etcd_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &format!("e1=http://127.0.0.1:{peer_port}"),
                "--initial-cluster-token",
                &scope,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(&dir.path().join("etcd.log")))
            .spawn()
            .expect("start etcd");
        let mut pair = PatroniPair {
            members: Vec::new(),
            etcd,
            etcd_port,
            scope,
            dir,
            owner,
        };
        pair.watch_for_exit();
        pair.wait(
            || http_status(etcd_port, "/health") == Some(200),
            "etcd to answer",
        );
        pair.add_member("pg1");
        pair.wait(
            || pair.members[0].answers("/primary") == Some(200),
            "pg1 to bootstrap as primary",
        );
        pair.add_member("pg2");
        pair.wait(
            || pair.members[1].answers("/sync") == Some(200),
            "pg2 to stream as the synchronous standby",
        );
        pair.psql(0, "postgres", &format!("CREATE DATABASE {database}"));
        pair
    }

    /// A connection string to `database` naming both members, that connects to whichever
    /// accepts writes.
    pub fn url(&self, database: &str) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.pg_port))
            .collect();
        format!(
            "postgresql://postgres:{SUPERUSER_PASSWORD}@{}/{database}?\
             target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    fn add_member(&mut self, name: &str) {
        let (pg_port, api_port) = (port(), port());
        let root = self.dir.path();
        let data_dir = root.join(name);
        let text = |p: &Path| p.to_string_lossy().into_owned();
        let yaml = member_yaml(&MemberSettings {
            scope: &self.scope,
            name,
            host: "127.0.0.1",
            pg_port,
            api_port,
            etcd: &format!("127.0.0.1:{}", self.etcd_port),
            data_dir: &text(&data_dir),
            bin_dir: &text(&super::pg_bindir()),
            pgpass: &text(&root.join(format!("{name}.pgpass"))),
            socket_dir: &text(root),
            clients: "127.0.0.1/32",
            superuser_password: SUPERUSER_PASSWORD,
            replication_password: REPLICATION_PASSWORD,
        });
        let config = root.join(format!("{name}.yml"));
        std::fs::write(&config, yaml).expect("write the member's configuration");
        let log = root.join(format!("{name}.log"));
        let mut member = Member {
            name: name.to_owned(),
            pg_port,
            api_port,
            data_dir,
            config,
            log,
            patroni: None,
        };
        self.run_patroni(&mut member);
        self.members.push(member);
    }

    fn run_patroni(&self, member: &mut Member) {
        let mut command = Command::new("patroni");
        command
            .arg(&member.config)
            .env("HOME", self.dir.path())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log_file(&member.log))
            .stderr(log_file(&member.log));
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        let child = command.spawn().expect("start patroni");
        append_line(&self.dir.path().join("pids"), &child.id().to_string());
        member.patroni = Some(child);
    }

    /// The member Patroni runs as primary now.
    pub fn primary(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.answers("/primary") == Some(200))
    }

    /// Kills member `i` the way its machine's death would: Patroni, the PostgreSQL server
    /// and every process the server started, with SIGKILL at once; returns once they are
    /// gone.
    pub fn kill(&mut self, i: usize) {
        let member = &mut self.members[i];
        let mut pids = Vec::new();
        if let Some(child) = &member.patroni {
            pids.push(child.id());
        }
        if let Some(postmaster) = member.postmaster() {
            pids.extend(children_of(postmaster));
            pids.push(postmaster);
        }
        let _ = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .stderr(Stdio::null())
            .status();
        if let Some(mut child) = member.patroni.take() {
            let _ = child.wait();
        }
        let began = Instant::now();
        while pids.iter().any(|&p| is_running(p)) {
            assert!(
                began.elapsed() < WAIT,
                "the killed member's processes live on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until member `i` is the primary; answers how long that took.
    pub fn wait_primary(&self, i: usize) -> Duration {
        let began = Instant::now();
        self.wait(
            || self.members[i].answers("/primary") == Some(200),
            "the standby's promotion",
        );
        began.elapsed()
    }

    /// Runs `sql` on member `i`'s server (over its socket, as the superuser).
    pub fn psql(&self, i: usize, database: &str, sql: &str) -> String {
        let psql = super::pg_bindir().join("psql");
        let out = Command::new(psql)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.dir.path())
            .args(["-p", &self.members[i].pg_port.to_string()])
            .args(["-U", "postgres", "-d", database, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql {sql:?} on {} failed: {}",
            self.members[i].name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// What every member logged, for a failure's message.
    pub fn logs(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                let log = m.log();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {} ---\n{}", m.name, tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn wait(&self, done: impl Fn() -> bool, what: &str) {
        let began = Instant::now();
        while !done() {
            assert!(
                began.elapsed() < WAIT,
                "waited {WAIT:?} in vain for {what}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A detached process that kills what this pair started and removes its directory once
    /// this process is gone.
    fn watch_for_exit(&self) {
        let dir = self.dir.path().to_string_lossy().into_owned();
        assert!(!dir.contains('\''), "unexpected quote in {dir}");
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
             kill -9 {etcd} $(cat '{dir}/pids' 2>/dev/null) 2>/dev/null; \
             for f in '{dir}'/*/postmaster.pid; do \
               [ -f \"$f\" ] && kill -9 \"$(head -n 1 \"$f\")\" 2>/dev/null; \
             done; \
             sleep 1; rm -rf '{dir}'",
            pid = std::process::id(),
            etcd = self.etcd.id()
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            // It outlives this process by design: nothing waits for it.
            .map(drop)
            .expect("start the cleanup watchdog");
    }
}

impl Drop for PatroniPair {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

fn port() -> u16 {
    free_port().unwrap_or_else(|e| panic!("{e}"))
}

fn log_file(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn append_line(path: &Path, line: &str) {
    writeln!(log_file(path), "{line}").unwrap_or_else(|e| panic!("{path:?}: {e}"));
}

/// The status code of `GET path` on 127.0.0.1:`port`, when something answers within a
/// second.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let timeout = Duration::from_secs(1);
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// The user and group of `postgres` when this process is root (PostgreSQL refuses to run as
/// root), else `None` (everything runs as this user).
fn server_user() -> Option<(u32, u32)> {
    let id = |flag: &str, user: Option<&str>| -> Option<u32> {
        let out = Command::new("id").arg(flag).args(user).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    if id("-u", None)? != 0 {
        return None;
    }
    let user = id("-u", Some("postgres")).expect("a `postgres` user (apt-get install postgresql)");
    let group = id("-g", Some("postgres")).expect("the `postgres` user's group");
    Some((user, group))
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat_field(pid, 1).and_then(|p| p.parse().ok()) == Some(parent))
        .collect()
}

/// Field `n` after the command name of `/proc/<pid>/stat` (0: the state, 1: the parent).
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(n).map(str::to_owned)
}

/// Whether `pid` runs (gone and zombies do not).
fn is_running(pid: u32) -> bool {
    !matches!(stat_field(pid, 0).as_deref(), None | Some("Z" | "X"))
}
