//! [`PgOptions`]: where a [`crate::PgStore`] keeps its tables, how many connections it pools
//! and how long it waits for the server; validated when the store opens. Owns the defaults and
//! the limits of those settings.

use std::num::NonZeroUsize;
use std::time::Duration;

use monoseq_kv::OpenError;

/// Default schema of the store's tables.
pub const SCHEMA_DEFAULT: &str = "public";
/// Default most connections a store keeps open.
pub const POOL_CONNECTIONS_DEFAULT: usize = 8;
/// Largest allowed pool: PostgreSQL's default `max_connections` is 100, shared by every client.
pub const POOL_CONNECTIONS_MAX: usize = 64;
/// Default longest wait for a new connection (TCP connect plus authentication).
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default longest run of one statement on the server, and longest wait for one answer of the
/// server on the client.
pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Longest a store's transaction may sit idle on the server before the server ends it. The
/// store's transactions wait for the client only for one round trip; one idle longer lost its
/// client (a node cut off from the database mid-write), and ending it releases the lease row
/// it locked, so that the partition's takeover and the other nodes' lease calls go on.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(2);
/// Idle time before TCP keepalives probe a connection whose peer may have vanished.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Default most batch-write transactions a store runs at once before the batches arriving
/// wait to share one (`combine.rs`).
pub const WRITE_TRANSACTIONS_DEFAULT: usize = 2;
/// Default longest a batch waits for a write transaction in flight to end before it starts one
/// of its own with the batches waiting: a bound on the wait that combining adds.
pub const COMBINE_WAIT_DEFAULT: Duration = Duration::from_millis(1);
/// Longest allowed timeout: past it a lost server is noticed too late.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(3600);
/// Longest schema name PostgreSQL accepts (`NAMEDATALEN - 1`).
const SCHEMA_NAME_BYTES_MAX: usize = 63;

/// Options of a [`crate::PgStore`].
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use monoseq_pg::PgOptions;
///
/// let options = PgOptions::default()
///     .schema("monoseq")
///     .pool_connections(4)
///     .connect_timeout(Duration::from_secs(2))
///     .statement_timeout(Duration::from_secs(10));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgOptions {
    pub(crate) schema: String,
    pub(crate) pool_connections: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout: Duration,
    pub(crate) write_transactions: usize,
    pub(crate) combine_wait: Duration,
}

impl Default for PgOptions {
    fn default() -> PgOptions {
        PgOptions {
            schema: SCHEMA_DEFAULT.to_owned(),
            pool_connections: POOL_CONNECTIONS_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            statement_timeout: STATEMENT_TIMEOUT_DEFAULT,
            write_transactions: WRITE_TRANSACTIONS_DEFAULT,
            combine_wait: COMBINE_WAIT_DEFAULT,
        }
    }
}

impl PgOptions {
    /// Sets the schema that holds the store's tables (default [`SCHEMA_DEFAULT`]); it is
    /// created at open when missing. Lowercase ASCII letters, digits and `_`, starting with a
    /// letter or `_`, at most 63 bytes. Stores in different schemas of one database are
    /// independent.
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> PgOptions {
        self.schema = schema.into();
        self
    }

    /// Sets the most connections the store keeps open (default [`POOL_CONNECTIONS_DEFAULT`],
    /// at most [`POOL_CONNECTIONS_MAX`]); callers beyond it wait for a free connection up to
    /// the connect timeout.
    #[must_use]
    pub fn pool_connections(mut self, connections: usize) -> PgOptions {
        self.pool_connections = connections;
        self
    }

    /// Sets the longest wait for a new connection, or for a free one when all are busy
    /// (default [`CONNECT_TIMEOUT_DEFAULT`]).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> PgOptions {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the longest run of one statement (the server's `statement_timeout`) and the
    /// longest wait for an answer of the server (default [`STATEMENT_TIMEOUT_DEFAULT`]). A
    /// call fails after at most the connect timeout plus this (a scan: without progress for
    /// this long).
    #[must_use]
    pub fn statement_timeout(mut self, timeout: Duration) -> PgOptions {
        self.statement_timeout = timeout;
        self
    }

    /// Sets how many batch-write transactions the store runs at once (default
    /// [`WRITE_TRANSACTIONS_DEFAULT`], between 1 and [`POOL_CONNECTIONS_MAX`]). A batch that
    /// finds fewer in flight and none waiting goes out at once, alone; the batches arriving
    /// while this many are in flight wait, and go together in one transaction (one commit)
    /// when one ends. Each batch keeps its own outcome. As many as the pool's connections
    /// makes batches share a transaction only when the pool is exhausted.
    #[must_use]
    pub fn write_transactions(mut self, transactions: usize) -> PgOptions {
        self.write_transactions = transactions;
        self
    }

    /// Sets the longest a waiting batch waits for a write transaction in flight to end before
    /// it starts one of its own, with the batches waiting then (default
    /// [`COMBINE_WAIT_DEFAULT`], at most [`TIMEOUT_MAX`]): a bound on the latency that sharing
    /// transactions adds.
    #[must_use]
    pub fn combine_wait(mut self, wait: Duration) -> PgOptions {
        self.combine_wait = wait;
        self
    }

    /// The checked pool size.
    pub(crate) fn pool_size(&self) -> Result<NonZeroUsize, OpenError> {
        NonZeroUsize::new(self.pool_connections)
            .filter(|n| n.get() <= POOL_CONNECTIONS_MAX)
            .ok_or_else(|| {
                OpenError::InvalidOption(format!(
                    "pool_connections is {}; it must be between 1 and {POOL_CONNECTIONS_MAX}",
                    self.pool_connections
                ))
            })
    }

    pub(crate) fn validate(&self) -> Result<(), OpenError> {
        self.pool_size()?;
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("statement_timeout", self.statement_timeout),
        ] {
            if value.as_millis() == 0 || value > TIMEOUT_MAX {
                return Err(OpenError::InvalidOption(format!(
                    "{name} is {value:?}; it must be at least 1 ms and at most {TIMEOUT_MAX:?}"
                )));
            }
        }
        if self.write_transactions == 0 || self.write_transactions > POOL_CONNECTIONS_MAX {
            return Err(OpenError::InvalidOption(format!(
                "write_transactions is {}; it must be between 1 and {POOL_CONNECTIONS_MAX}",
                self.write_transactions
            )));
        }
        if self.combine_wait > TIMEOUT_MAX {
            return Err(OpenError::InvalidOption(format!(
                "combine_wait is {:?}; it must be at most {TIMEOUT_MAX:?}",
                self.combine_wait
            )));
        }
        if !is_plain_identifier(&self.schema) {
            return Err(OpenError::InvalidOption(format!(
                "schema {:?} is not a plain identifier; use lowercase ASCII letters, digits and \
                 `_`, starting with a letter or `_`, at most {SCHEMA_NAME_BYTES_MAX} bytes",
                self.schema
            )));
        }
        Ok(())
    }
}

/// Whether `name` can be spliced into SQL as an identifier without quoting: this is what keeps
/// the schema option from injecting SQL.
pub(crate) fn is_plain_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    let Some(first) = bytes.next() else {
        return false;
    };
    name.len() <= SCHEMA_NAME_BYTES_MAX
        && (first.is_ascii_lowercase() || first == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_that_could_inject_sql_are_refused() {
        for bad in [
            "",
            "Public",
            "1abc",
            "a-b",
            "a;drop table x",
            "a\"b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(
                PgOptions::default().schema(bad).validate().is_err(),
                "{bad:?} accepted"
            );
        }
        for good in ["public", "_x", "monoseq_test_12", &"a".repeat(63)] {
            assert!(PgOptions::default().schema(good).validate().is_ok());
        }
    }

    #[test]
    fn pool_size_and_timeouts_out_of_range_are_refused() {
        assert!(PgOptions::default().pool_connections(0).validate().is_err());
        assert!(
            PgOptions::default()
                .pool_connections(POOL_CONNECTIONS_MAX + 1)
                .validate()
                .is_err()
        );
        assert!(
            PgOptions::default()
                .connect_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            PgOptions::default()
                .statement_timeout(TIMEOUT_MAX + Duration::from_secs(1))
                .validate()
                .is_err()
        );
        assert!(
            PgOptions::default()
                .write_transactions(0)
                .validate()
                .is_err()
        );
        assert!(
            PgOptions::default()
                .combine_wait(TIMEOUT_MAX + Duration::from_secs(1))
                .validate()
                .is_err()
        );
        assert!(PgOptions::default().validate().is_ok());
    }
}
