//! Real network faults: every host of a test (each node, the database) in a network namespace
//! of its own, joined by veth pairs to a bridge in a hub namespace, on a private /24 of
//! 10.0.0.0/8 that no other run on this machine uses. The test process reaches the hosts
//! through one more veth pair from its own namespace to the bridge (its clients are the load
//! balancer's view). Faults are nftables rules inside a host's namespace: `drop` (packets
//! vanish, no reset: a blackhole), `reject` (refused at once) and `numgen random` (a share of
//! packets lost; this kernel has no netem).
//!
//! Everything is removed when the [`Net`] is dropped, and by a watchdog process if the test
//! process dies first. Needs root (CAP_NET_ADMIN): without it the test fails saying so.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use monoseq_pg::testing::{DATABASE, PASSWORD, PgCluster, SUPERUSER};

/// The nftables table every host's faults live in.
const TABLE: &str = "faults";
/// Metric of the route that keeps the test subnet off every other interface of this machine
/// once the test's own link is gone.
const GUARD_METRIC: &str = "4000";

/// A host of the test network: a namespace and its address.
#[derive(Debug, Clone)]
pub struct Host {
    pub ns: String,
    pub ip: Ipv4Addr,
}

/// What a fault does to the packets it matches.
#[derive(Debug, Clone, Copy)]
pub enum Verdict {
    /// Packets vanish: no reset, no ICMP; the sender waits until its own timeouts.
    Blackhole,
    /// Packets are refused at once (TCP reset, ICMP unreachable): the sender fails fast.
    Refuse,
}

impl Verdict {
    /// The rule bodies, in order, for packets that matched.
    fn rules(self) -> &'static [&'static str] {
        match self {
            Verdict::Blackhole => &["drop"],
            // An ICMP error is a soft error to an established TCP connection (it retransmits
            // on); a reset ends it at once. Resets pass, so that the ones a reject sends to a
            // local socket (from the refused address) reach it.
            Verdict::Refuse => &[
                "tcp flags & rst == rst accept",
                "meta l4proto tcp reject with tcp reset",
                "reject with icmpx admin-prohibited",
            ],
        }
    }
}

/// A private network of namespaces; dropped, it removes every namespace, link and route it
/// made, after killing what still runs inside.
pub struct Net {
    prefix: String,
    subnet: [u8; 3],
    hub: String,
    hosts: Vec<Host>,
    root_link: String,
}

fn ip(args: &[&str]) -> Result<String, String> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn must(result: Result<String, String>) -> String {
    result.unwrap_or_else(|e| panic!("{e}"))
}

impl Net {
    /// A hub namespace with a bridge, and the test process's own link to it.
    pub fn new() -> Net {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let prefix = loop {
            let n = NEXT.fetch_add(1, Ordering::SeqCst);
            let candidate = format!("mq{}x{n}", base36(pid));
            let taken = must(ip(&["netns", "list"]));
            if !taken.lines().any(|l| l.starts_with(&candidate)) {
                break candidate;
            }
        };
        // Checked before the first namespace exists: a refusal after it would leave the hub
        // behind, with no network value yet to remove it.
        assert!(
            run("nft", &["--version"]).is_ok(),
            "nftables is not installed: `apt-get install nftables` (scripts/test does)"
        );
        let hub = format!("{prefix}hub");
        if let Err(e) = ip(&["netns", "add", &hub]) {
            panic!(
                "these tests put each node and the database in a network namespace of its own \
                 and need root (CAP_NET_ADMIN) for it; CI runs them as root. {e}"
            );
        }
        let subnet = free_subnet(pid);
        let root_link = format!("{prefix}r");
        let net = Net {
            prefix,
            subnet,
            hub,
            hosts: Vec::new(),
            root_link,
        };
        net.watch_for_exit();
        let hub = net.hub.as_str();
        must(ip(&["-n", hub, "link", "set", "lo", "up"]));
        must(ip(&["-n", hub, "link", "add", "br0", "type", "bridge"]));
        must(ip(&["-n", hub, "link", "set", "br0", "up"]));
        // The guard first: whatever happens to the link below, this subnet never leaves the
        // machine.
        let cidr = net.cidr();
        must(ip(&[
            "route",
            "add",
            "unreachable",
            &cidr,
            "metric",
            GUARD_METRIC,
        ]));
        must(ip(&[
            "link",
            "add",
            &net.root_link,
            "type",
            "veth",
            "peer",
            "name",
            "root",
            "netns",
            hub,
        ]));
        must(ip(&[
            "-n", hub, "link", "set", "root", "master", "br0", "up",
        ]));
        let own = format!("{}/24", net.address(254));
        must(ip(&["addr", "add", &own, "dev", &net.root_link]));
        must(ip(&["link", "set", &net.root_link, "up"]));
        net
    }

    fn address(&self, host: u8) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, host)
    }

    /// The test subnet, `10.x.y.0/24`.
    pub fn cidr(&self) -> String {
        format!("{}/24", self.address(0))
    }

    /// A new host `name` with its own namespace, address and (empty) fault table.
    pub fn host(&mut self, name: &str) -> Host {
        let number = u8::try_from(self.hosts.len() + 1).expect("fewer than 250 hosts");
        let ns = format!("{}{name}", self.prefix);
        must(ip(&["netns", "add", &ns]));
        let host = Host {
            ns: ns.clone(),
            ip: self.address(number),
        };
        self.hosts.push(host.clone());
        let port = format!("h{number}");
        must(ip(&[
            "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port, "netns",
            &self.hub,
        ]));
        must(ip(&[
            "-n", &self.hub, "link", "set", &port, "master", "br0", "up",
        ]));
        must(ip(&["-n", &ns, "link", "set", "lo", "up"]));
        let own = format!("{}/24", host.ip);
        must(ip(&["-n", &ns, "addr", "add", &own, "dev", "eth0"]));
        must(ip(&["-n", &ns, "link", "set", "eth0", "up"]));
        nft(
            &ns,
            &format!(
                "add table inet {TABLE}\n\
                 add chain inet {TABLE} input {{ type filter hook input priority 0; policy accept; }}\n\
                 add chain inet {TABLE} output {{ type filter hook output priority 0; policy accept; }}\n"
            ),
        );
        host
    }

    /// Cuts `host` off from `others`: their packets to and from it get `verdict`, in both
    /// directions (the rules sit in `host`'s namespace). Clients and the other hosts still
    /// reach it.
    pub fn cut(&self, host: &Host, others: &[&Host], verdict: Verdict) {
        let mut script = String::new();
        for other in others {
            for v in verdict.rules() {
                let o = other.ip;
                script.push_str(&format!(
                    "add rule inet {TABLE} output ip daddr {o} {v}\n\
                     add rule inet {TABLE} input ip saddr {o} {v}\n"
                ));
            }
        }
        nft(&host.ns, &script);
    }

    /// Drops `percent` % of the packets `host` sends and of those it receives, at random.
    pub fn lose(&self, host: &Host, percent: u8) {
        nft(
            &host.ns,
            &format!(
                "add rule inet {TABLE} output numgen random mod 100 < {percent} drop\n\
                 add rule inet {TABLE} input numgen random mod 100 < {percent} drop\n"
            ),
        );
    }

    /// Removes every fault of `host`.
    pub fn heal(&self, host: &Host) {
        nft(
            &host.ns,
            &format!("flush chain inet {TABLE} input\nflush chain inet {TABLE} output\n"),
        );
    }

    /// The packets `host` dropped or refused so far (counted by its rules).
    pub fn ruleset(&self, host: &Host) -> String {
        must(run(
            "ip",
            &[
                "netns", "exec", &host.ns, "nft", "list", "table", "inet", TABLE,
            ],
        ))
    }

    /// Starts a detached process that removes everything once this process is gone.
    fn watch_for_exit(&self) {
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {cleanup}",
            pid = std::process::id(),
            cleanup = self.cleanup_script()
        );
        Command::new("setsid")
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            // It outlives this process by design: nothing waits for it.
            .map(drop)
            .expect("start the network's cleanup watchdog");
    }

    /// Kills what runs in this network's namespaces (started by this test), then removes the
    /// namespaces, the test process's link and the guard route. A namespace's name is the
    /// prefix and then a letter, so `…x1` never takes `…x10`'s.
    fn cleanup_script(&self) -> String {
        format!(
            "for ns in $(ip netns list | cut -d' ' -f1 | grep '^{prefix}[a-z]'); do \
               for p in $(ip netns pids \"$ns\"); do kill -9 \"$p\"; done; \
               ip netns del \"$ns\"; \
             done; \
             ip link del {link} 2>/dev/null; \
             ip route del unreachable {cidr} metric {GUARD_METRIC} 2>/dev/null; true",
            prefix = self.prefix,
            link = self.root_link,
            cidr = self.cidr()
        )
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .args(["-c", &self.cleanup_script()])
            .stdin(Stdio::null())
            .status();
    }
}

fn nft(ns: &str, script: &str) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nft");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), script.as_bytes())
        .expect("write nft's script");
    drop(child.stdin.take());
    let out = child.wait_with_output().expect("nft");
    assert!(
        out.status.success(),
        "nft in {ns} refused:\n{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// A /24 of 10.0.0.0/8 that no route of this machine covers yet, chosen from this process's
/// ID (so concurrent test processes start in different places).
fn free_subnet(pid: u32) -> [u8; 3] {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    for _ in 0..1_000 {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let b = 100 + (pid % 100) as u8;
        let c = ((pid / 100 + n) % 250) as u8;
        let cidr = format!("10.{b}.{c}.0/24");
        // Every route covering it but the default one: another run's link or guard, a VPN.
        let routes = must(ip(&["-4", "route", "show", "match", &cidr]));
        if !routes
            .lines()
            .any(|l| !l.trim().is_empty() && !l.starts_with("default"))
        {
            return [10, b, c];
        }
    }
    panic!("no free /24 in 10.0.0.0/8")
}

/// A private PostgreSQL server (as [`PgCluster`]) serving from inside `host`'s namespace:
/// listening on its address only, accepting password logins from the test subnet.
pub struct NetDb {
    cluster: PgCluster,
    pub url: String,
}

impl NetDb {
    pub fn start(net: &Net, host: &Host) -> NetDb {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        cluster.stop_server().unwrap_or_else(|e| panic!("{e}"));
        let data = cluster.data_dir().expect("the cluster's data directory");
        append(
            &data.join("postgresql.conf"),
            &format!("\nlisten_addresses = '{}'\n", host.ip),
        );
        append(
            &data.join("pg_hba.conf"),
            &format!("\nhost all all {} scram-sha-256\n", net.cidr()),
        );
        let log = data
            .parent()
            .expect("the cluster's directory")
            .join("ns.log");
        let pg_ctl = super::pg_bindir().join("pg_ctl");
        let data_arg = data.to_string_lossy().into_owned();
        let log_arg = log.to_string_lossy().into_owned();
        let started = run(
            "ip",
            &[
                "netns",
                "exec",
                &host.ns,
                "runuser",
                "-u",
                "postgres",
                "--",
                &pg_ctl.to_string_lossy(),
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                &data_arg,
                "-l",
                &log_arg,
            ],
        );
        if let Err(e) = started {
            panic!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        let url = format!(
            "postgresql://{SUPERUSER}:{PASSWORD}@{}:{}/{DATABASE}",
            host.ip,
            cluster.port()
        );
        NetDb { cluster, url }
    }

    /// Runs `sql` in the database as the superuser (over the server's socket, which no
    /// network fault reaches); answers what it printed, or why it failed.
    pub fn psql(&self, sql: &str) -> String {
        self.cluster
            .psql(DATABASE, sql)
            .unwrap_or_else(|e| e.to_string())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.cluster
            .data_dir()
            .expect("the cluster's data directory")
    }
}

fn append(path: &Path, text: &str) {
    let mut all = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    all.push_str(text);
    std::fs::write(path, all).unwrap_or_else(|e| panic!("{path:?}: {e}"));
}
