//! Several nodes on one database: each partition is served by the node holding its **lease**,
//! whose **epoch** every write of the partition is fenced with (the database refuses a write of
//! an older epoch, so a node that lost a lease changes nothing however late its write lands).
//!
//! The rules (fair share, handoffs, watchdogs, one live run per name) are the state machine of
//! `monoseq-membership`; this module holds the cluster flags and `[cluster]` settings, and its
//! submodules the driver that runs the state machine on tokio (`driver.rs`), the PostgreSQL
//! lease table (`pg.rs`) and `monoseq cluster status` (`status.rs`).

mod driver;
pub mod marks;
mod pg;
mod status;

pub use driver::Cluster;
pub use marks::NodeMarks;
pub use pg::{FencedLeases, LEASE_POOL_CONNECTIONS, PgLeaseTable};
pub use status::{ClusterCmd, run_command};

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

/// Default lease duration.
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// Default renewal interval.
pub const LEASE_RENEW_MS_DEFAULT: u64 = 2_000;
/// Shortest lease accepted.
pub const LEASE_MS_MIN: u64 = 500;
/// Longest lease accepted.
pub const LEASE_MS_MAX: u64 = 600_000;
/// A lease must last at least this many renewal intervals, so that a node keeps serving
/// through a renewal or two that fail or come late.
pub const RENEWALS_PER_LEASE_MIN: u64 = monoseq_membership::RENEWALS_PER_LEASE_MIN;

/// Cluster settings of `monoseq serve` (used when the storage is PostgreSQL); each also reads
/// `MONOSEQ_<NAME>` from the environment, and the `[cluster]` table of the settings file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// This node's name, unique among the running nodes of one database; a node restarted
    /// with the same name takes its partitions back at once [default: the host name and the
    /// configured listen port].
    #[arg(long, env = "MONOSEQ_NODE_ID")]
    pub node_id: Option<String>,
    /// The URL other nodes (and redirected clients) reach this node at [default:
    /// `http://` and the address it listens on].
    #[arg(long, env = "MONOSEQ_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// How long a partition's lease lasts without renewal, milliseconds [default: 10000].
    #[arg(long, env = "MONOSEQ_LEASE_MS")]
    pub lease_ms: Option<u64>,
    /// How often leases are renewed, milliseconds; at most a third of the lease [default:
    /// 2000].
    #[arg(long, env = "MONOSEQ_LEASE_RENEW_MS")]
    pub lease_renew_ms: Option<u64>,
    /// Answer a command for a partition another node owns with a redirect (307) to that node
    /// instead of forwarding it.
    #[arg(long, env = "MONOSEQ_REDIRECT")]
    pub redirect: bool,
    /// CA certificates trusted when forwarding to other nodes over HTTPS [default: this node's
    /// own --tls-cert, else the system's CAs].
    #[arg(long, env = "MONOSEQ_PEER_CA_CERT")]
    pub peer_ca_cert: Option<std::path::PathBuf>,
    /// Directory of this node's high-water marks, kept on its own disk so that a database
    /// that loses acknowledged writes (an asynchronous standby promoted, a restored backup)
    /// cannot take them along; one process per directory [default: the node ID under ./monoseq-marks].
    #[arg(long, env = "MONOSEQ_MARKS_DIR")]
    pub marks_dir: Option<std::path::PathBuf>,
}

/// The `[cluster]` table of the settings file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    node_id: Option<String>,
    advertise_url: Option<String>,
    lease_ms: Option<u64>,
    lease_renew_ms: Option<u64>,
    redirect: Option<bool>,
    peer_ca_cert: Option<std::path::PathBuf>,
    marks_dir: Option<std::path::PathBuf>,
}

/// Resolved cluster settings.
#[derive(Debug, Clone)]
pub struct ClusterSettings {
    /// This node's name.
    pub node_id: String,
    /// Where other nodes reach it.
    pub advertise_url: String,
    /// Lease duration.
    pub lease: Duration,
    /// Renewal interval.
    pub renew: Duration,
    /// Redirect instead of forwarding.
    pub redirect: bool,
    /// CA certificates trusted when forwarding over HTTPS.
    pub peer_ca_cert: Option<std::path::PathBuf>,
    /// This node's marks directory.
    pub marks_dir: std::path::PathBuf,
}

/// The default marks directory of node `node_id`.
pub const MARKS_DIR_DEFAULT: &str = "./monoseq-marks";

impl ClusterArgs {
    /// Flags and environment over the file over the defaults; `configured` is the listen
    /// address as configured (its port may be 0), `local` the address the server listens on,
    /// `scheme` `http` or `https`.
    ///
    /// # Errors
    ///
    /// A node ID or URL that is not acceptable, or a lease and renewal interval that do not fit.
    pub fn resolve(
        &self,
        file: &ClusterFile,
        configured: SocketAddr,
        local: SocketAddr,
        scheme: &str,
    ) -> anyhow::Result<ClusterSettings> {
        let lease_ms = self.lease_ms.or(file.lease_ms).unwrap_or(LEASE_MS_DEFAULT);
        let renew_ms = self
            .lease_renew_ms
            .or(file.lease_renew_ms)
            .unwrap_or(LEASE_RENEW_MS_DEFAULT);
        check_lease(lease_ms, renew_ms)?;
        let node_id = match self.node_id.clone().or_else(|| file.node_id.clone()) {
            Some(id) => id,
            None => format!("{}-{}", host_name(), configured.port()),
        };
        check_node_id(&node_id)?;
        let marks_dir = self
            .marks_dir
            .clone()
            .or_else(|| file.marks_dir.clone())
            .unwrap_or_else(|| std::path::Path::new(MARKS_DIR_DEFAULT).join(&node_id));
        let advertise_url = match self
            .advertise_url
            .clone()
            .or_else(|| file.advertise_url.clone())
        {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => default_url(local, scheme)?,
        };
        check_url(&advertise_url)?;
        Ok(ClusterSettings {
            node_id,
            advertise_url,
            lease: Duration::from_millis(lease_ms),
            renew: Duration::from_millis(renew_ms),
            redirect: self.redirect || file.redirect.unwrap_or(false),
            peer_ca_cert: self
                .peer_ca_cert
                .clone()
                .or_else(|| file.peer_ca_cert.clone()),
            marks_dir,
        })
    }
}

fn check_lease(lease_ms: u64, renew_ms: u64) -> anyhow::Result<()> {
    if !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&lease_ms) {
        bail!("--lease-ms must be between {LEASE_MS_MIN} and {LEASE_MS_MAX}, got {lease_ms}");
    }
    if renew_ms == 0 || renew_ms.saturating_mul(RENEWALS_PER_LEASE_MIN) > lease_ms {
        bail!(
            "--lease-renew-ms must be at least 1 and at most a third of --lease-ms \
             ({lease_ms} ms): renewals must come well before the lease expires, got {renew_ms}"
        );
    }
    Ok(())
}

fn check_node_id(id: &str) -> anyhow::Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if !ok {
        bail!(
            "--node-id {id:?} is not acceptable: 1 to 128 characters of letters, digits, \
             '-', '_', '.' and ':'"
        );
    }
    Ok(())
}

fn check_url(url: &str) -> anyhow::Result<()> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match rest {
        Some(host) if !host.is_empty() && !host.contains('/') => Ok(()),
        _ => bail!(
            "--advertise-url {url:?} is not acceptable: give http://host:port or \
             https://host:port, without a path"
        ),
    }
}

fn default_url(local: SocketAddr, scheme: &str) -> anyhow::Result<String> {
    if local.ip().is_unspecified() {
        bail!(
            "the server listens on every interface ({local}): give --advertise-url, the URL \
             other nodes reach this one at"
        );
    }
    Ok(format!("{scheme}://{local}"))
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "monoseq".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_interval_must_fit_three_times_into_the_lease() {
        assert!(check_lease(3_000, 1_000).is_ok());
        let e = check_lease(2_000, 1_000).unwrap_err().to_string();
        assert!(e.contains("--lease-renew-ms"), "{e}");
        assert!(check_lease(3_000, 0).is_err());
        assert!(check_lease(100, 10).is_err(), "below the shortest lease");
    }

    #[test]
    fn node_ids_and_urls_are_checked() {
        assert!(check_node_id("node-1.a:2").is_ok());
        assert!(check_node_id("").is_err());
        assert!(check_node_id("a b").is_err());
        assert!(check_url("http://10.0.0.1:8080").is_ok());
        assert!(check_url("https://n1.example:443").is_ok());
        assert!(check_url("ftp://x").is_err());
        assert!(check_url("http://x/path").is_err());
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(
            default_url(any, "http").is_err(),
            "an unspecified address is not a URL"
        );
    }
}
