//! A node's membership parameters, validated once, and the durations derived from them (the
//! watchdog margins, how long a name stays claimed without heartbeats, how often a node polls
//! while it waits for a handoff). Every derived duration is stated here and nowhere else.

use std::fmt;

/// A lease must last at least this many renewal intervals, so that a node keeps serving
/// through a renewal or two that fail or come late.
pub const RENEWALS_PER_LEASE_MIN: u64 = 3;
/// Fastest status poll while a handoff to this node is expected, milliseconds.
pub const HANDOFF_POLL_MS_MIN: u64 = 10;
/// Slowest status poll while a handoff to this node is expected, milliseconds.
pub const HANDOFF_POLL_MS_MAX: u64 = 100;
/// Longest node name accepted.
pub const NODE_ID_BYTES_MAX: usize = 128;

/// A node's membership parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub(crate) node_id: String,
    pub(crate) run_id: String,
    pub(crate) url: String,
    pub(crate) partitions: u32,
    pub(crate) lease_ms: u64,
    pub(crate) renew_ms: u64,
    pub(crate) dir_id: String,
}

/// Parameters that cannot work together.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The renewal interval does not fit [`RENEWALS_PER_LEASE_MIN`] times into the lease.
    Renewal {
        /// The lease, milliseconds.
        lease_ms: u64,
        /// The renewal interval, milliseconds.
        renew_ms: u64,
    },
    /// No partitions.
    NoPartitions,
    /// An empty or over-long node name or run ID.
    Name(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Renewal { lease_ms, renew_ms } => write!(
                f,
                "a renewal interval of {renew_ms} ms does not fit {RENEWALS_PER_LEASE_MIN} times \
                 into a lease of {lease_ms} ms: give a renewal interval of at least 1 ms and at \
                 most a third of the lease"
            ),
            ConfigError::NoPartitions => write!(f, "a cluster needs at least one partition"),
            ConfigError::Name(what) => {
                write!(f, "{what} must be 1 to {NODE_ID_BYTES_MAX} bytes long")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// The parameters of node `node_id` (this process's run of it is `run_id`, unique per
    /// start), reached at `url`, in a cluster of `partitions` partitions whose leases last
    /// `lease_ms` and are renewed every `renew_ms`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when the renewal interval is 0 or more than a third of the lease, when
    /// there are no partitions, or when a name is empty or longer than [`NODE_ID_BYTES_MAX`].
    ///
    /// # Example
    ///
    /// ```
    /// use monoseq_membership::Config;
    ///
    /// assert!(Config::new("a", "r1", "http://a:1", 64, 10_000, 2_000).is_ok());
    /// assert!(Config::new("a", "r1", "http://a:1", 64, 1_000, 500).is_err());
    /// ```
    pub fn new(
        node_id: &str,
        run_id: &str,
        url: &str,
        partitions: u32,
        lease_ms: u64,
        renew_ms: u64,
    ) -> Result<Config, ConfigError> {
        if renew_ms == 0 || renew_ms.saturating_mul(RENEWALS_PER_LEASE_MIN) > lease_ms {
            return Err(ConfigError::Renewal { lease_ms, renew_ms });
        }
        if partitions == 0 {
            return Err(ConfigError::NoPartitions);
        }
        for (name, what) in [(node_id, "a node ID"), (run_id, "a run ID")] {
            if name.is_empty() || name.len() > NODE_ID_BYTES_MAX {
                return Err(ConfigError::Name(what.to_owned()));
            }
        }
        Ok(Config {
            node_id: node_id.to_owned(),
            run_id: run_id.to_owned(),
            url: url.to_owned(),
            partitions,
            lease_ms,
            renew_ms,
            dir_id: String::new(),
        })
    }

    /// The same parameters for a run that holds the lock of the directory whose identity is
    /// `dir_id` (recorded with its name): an earlier run of the name that recorded the same
    /// identity held that lock too, and is therefore dead, so this run claims the name from it
    /// and takes its leases back at once instead of waiting for it to go stale.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Name`] when `dir_id` is empty or longer than [`NODE_ID_BYTES_MAX`].
    pub fn with_dir_id(mut self, dir_id: &str) -> Result<Config, ConfigError> {
        if dir_id.is_empty() || dir_id.len() > NODE_ID_BYTES_MAX {
            return Err(ConfigError::Name("a directory identity".to_owned()));
        }
        self.dir_id = dir_id.to_owned();
        Ok(self)
    }

    /// The identity of the directory whose lock this run holds (empty: none).
    #[must_use]
    pub fn dir_id(&self) -> &str {
        &self.dir_id
    }

    /// The node's name.
    #[must_use]
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// This run's ID.
    #[must_use]
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Where the node is reached.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The number of partitions.
    #[must_use]
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The lease, milliseconds.
    #[must_use]
    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// The renewal interval, milliseconds.
    #[must_use]
    pub fn renew_ms(&self) -> u64 {
        self.renew_ms
    }

    /// How long after a lease call was sent the node may serve under it: the lease less one
    /// renewal interval, the margin that absorbs the node's clock running slow (by up to
    /// `renew / lease` of its rate) and the watchdog's own delay.
    #[must_use]
    pub fn lease_valid_ms(&self) -> u64 {
        self.lease_ms - self.renew_ms
    }

    /// A name whose last heartbeat is this old (by the database's clock) may be claimed by a
    /// new run: half the lease, but at least three renewal intervals (so that one failed
    /// heartbeat never lets another run in). A restarted node thus takes its partitions back
    /// well before their leases would expire.
    #[must_use]
    pub fn name_stale_ms(&self) -> u64 {
        (self.lease_ms / 2).max(RENEWALS_PER_LEASE_MIN * self.renew_ms)
    }

    /// How long after a heartbeat was sent the node may serve without a newer one confirming
    /// its name: half a renewal interval less than [`Config::name_stale_ms`], so that it has
    /// stopped before a new run can claim the name.
    #[must_use]
    pub fn name_valid_ms(&self) -> u64 {
        self.name_stale_ms() - self.renew_ms / 2
    }

    /// How long a new run waits for another run's heartbeat under its name to stop before it
    /// refuses to start: long enough for a dead run's heartbeat to go stale and be claimed.
    #[must_use]
    pub fn name_wait_ms(&self) -> u64 {
        self.name_stale_ms() + 2 * self.renew_ms
    }

    /// A node is alive while its last heartbeat is younger than this: one lease.
    #[must_use]
    pub fn alive_ms(&self) -> u64 {
        self.lease_ms
    }

    /// How often a node reads the table while a partition is being handed to it.
    #[must_use]
    pub fn handoff_poll_ms(&self) -> u64 {
        (self.renew_ms / 10).clamp(HANDOFF_POLL_MS_MIN, HANDOFF_POLL_MS_MAX)
    }
}
