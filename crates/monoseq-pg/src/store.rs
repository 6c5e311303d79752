//! [`PgStore`]: the key-value contract on a PostgreSQL table. Owns opening (connection string,
//! pool, runtime, schema check), point reads, compare-and-swap, and the dispatch of every call
//! onto the store's runtime with its time limit, for the store and for its fenced views
//! (`fenced.rs`, which passes the lease epoch every write checks, `fence.rs`); what every
//! operation shares is in `core.rs`, batches in `write.rs` and `combine.rs`, scans in `scan.rs`,
//! leases in `lease.rs`.

use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::join4;
use monoseq_kv::{
    CasError, Key, KvError, KvStore, OpenError, Order, Visitor, WriteBatch, WriteError, limits,
};
use tokio::runtime::Runtime;
use tokio_postgres::config::Host;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Statement};

use crate::combine::{Combiner, Combining};
use crate::core::{CAS_ATTEMPTS_MAX, Inner, WRITE_ATTEMPTS_MAX, read_many};
use crate::error::{Failure, storage_open_error};
use crate::exec::{self, Conn, within};
use crate::fence::Fence;
use crate::options::PgOptions;
use crate::plan::Plan;
use crate::sql::Sql;
use crate::write::{self, Outcome};

/// The PostgreSQL backend: one table `monoseq_kv (partition bytea, clustering bytea, value
/// bytea, primary key (partition, clustering))` in the schema of [`PgOptions::schema`], reached
/// through a pool of connections.
///
/// Every write is durable when it returns: the store's sessions run with
/// `synchronous_commit = on`, so a commit returns after the server flushed its write-ahead log
/// (and, where the server has synchronous standbys, after they confirmed it); [`KvStore::sync`]
/// therefore does nothing. The server's own `fsync` setting must stay on.
///
/// The calls block the calling thread. From async code call them through
/// `tokio::task::spawn_blocking`, as for any blocking store; called on an async task they do
/// not panic, but they hold that task's thread until the server answers.
///
/// # Example
///
/// ```no_run
/// use monoseq_kv::{Key, KvStore};
/// use monoseq_pg::{PgOptions, PgStore};
///
/// let store = PgStore::open(
///     "postgresql://monoseq:secret@db.example:5432/monoseq",
///     PgOptions::default().schema("monoseq"),
/// )?;
/// store.put(Key::new(b"p", b"a"), b"1")?;
/// assert_eq!(store.get(Key::new(b"p", b"a"))?, Some(b"1".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PgStore {
    pub(crate) core: Arc<Core>,
}

/// What a store and its views ([`crate::Leases`], [`crate::FencedPgStore`]) share: the
/// connections, the runtime that drives them, and what error messages name.
pub(crate) struct Core {
    pub(crate) inner: Arc<Inner>,
    /// Carries concurrent batch writes in shared transactions (`combine.rs`).
    pub(crate) combiner: Arc<Combiner>,
    /// Drives the connections; `None` only while dropping.
    runtime: Option<Runtime>,
    pub(crate) location: String,
    schema: String,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.core.location)
            .finish_non_exhaustive()
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Never blocks, so dropping the store on an async task cannot panic.
            runtime.shutdown_background();
        }
    }
}

/// The connection string without its password, and the schema: what error messages name.
fn location(config: &tokio_postgres::Config, schema: &str) -> String {
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let host = match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            };
            // One port for every host, or one each.
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    format!(
        "postgresql://{}@{}/{} (schema {schema})",
        config.get_user().unwrap_or_default(),
        hosts.join(","),
        config.get_dbname().unwrap_or_default()
    )
}

/// The connection settings of `url`, which must name a host and a user.
fn parse_url(url: &str) -> Result<tokio_postgres::Config, OpenError> {
    let config: tokio_postgres::Config = url.parse().map_err(|e| {
        OpenError::InvalidOption(format!(
            "the PostgreSQL connection string is malformed ({e}); expected \
             postgresql://user:password@host:port/database or host=… user=… dbname=…"
        ))
    })?;
    if config.get_hosts().is_empty() {
        return Err(OpenError::InvalidOption(
            "the PostgreSQL connection string names no host".to_owned(),
        ));
    }
    if config.get_user().is_none() {
        return Err(OpenError::InvalidOption(
            "the PostgreSQL connection string names no user".to_owned(),
        ));
    }
    Ok(config)
}

/// Sets what every session of the store runs with: the statement and idle-in-transaction
/// time limits and `synchronous_commit = on` (after any options the connection string gives),
/// TCP keepalives, the connect timeout, and the application name unless one is given.
fn configure_session(config: &mut tokio_postgres::Config, options: &PgOptions) {
    let statement_ms = options.statement_timeout.as_millis();
    let idle_ms = options
        .statement_timeout
        .min(crate::options::IDLE_IN_TRANSACTION_TIMEOUT)
        .as_millis();
    let session = format!(
        "-c statement_timeout={statement_ms} -c idle_in_transaction_session_timeout=\
         {idle_ms} -c synchronous_commit=on"
    );
    config.keepalives(true);
    config.keepalives_idle(crate::options::KEEPALIVE_IDLE);
    let session = match config.get_options() {
        Some(given) if !given.is_empty() => format!("{given} {session}"),
        _ => session,
    };
    config.options(session);
    config.connect_timeout(options.connect_timeout);
    if config.get_application_name().is_none() {
        config.application_name("monoseq");
    }
}

/// The pool of at most `size` connections made with `config`; waiting for, making and
/// recycling one each take at most the connect timeout.
fn build_pool(
    config: tokio_postgres::Config,
    options: &PgOptions,
    size: usize,
    location: &str,
) -> Result<Pool, OpenError> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .wait_timeout(Some(options.connect_timeout))
        .create_timeout(Some(options.connect_timeout))
        .recycle_timeout(Some(options.connect_timeout))
        .build()
        .map_err(|e| {
            storage_open_error(
                location,
                KvError::backend("building the connection pool failed", e.to_string()),
            )
        })
}

impl PgStore {
    /// Connects to the database of `url` (`postgresql://user:password@host:port/database`, or
    /// the `host=… user=…` form), creates the store's schema and tables when they are missing,
    /// and checks the schema version recorded there. Connections are made without TLS.
    ///
    /// # Errors
    ///
    /// - [`OpenError::InvalidOption`] when `url` does not parse or names no host or user, or
    ///   when `options` are out of range.
    /// - [`OpenError::Storage`] when the server cannot be reached or refuses the credentials
    ///   (within [`PgOptions::connect_timeout`]), when the schema or tables cannot be created,
    ///   or when the database holds a schema version newer than this build reads (the message
    ///   names both versions).
    pub fn open(url: &str, options: PgOptions) -> Result<PgStore, OpenError> {
        options.validate()?;
        let pool_size = options.pool_size()?;
        let mut config = parse_url(url)?;
        configure_session(&mut config, &options);
        let location = location(&config, &options.schema);
        let runtime = exec::runtime().map_err(|source| {
            storage_open_error(
                &location,
                KvError::Io {
                    context: "starting the PostgreSQL driver's runtime",
                    source,
                },
            )
        })?;
        let pool = build_pool(config, &options, pool_size.get(), &location)?;
        let inner = Arc::new(Inner {
            pool,
            sql: Sql::new(&options.schema),
            connect_timeout: options.connect_timeout,
            statement_timeout: options.statement_timeout,
        });
        let combiner = Combiner::new(&inner, runtime.handle(), &options);
        let core = Core {
            inner,
            combiner: Arc::new(combiner),
            runtime: Some(runtime),
            location,
            schema: options.schema.clone(),
        };
        core.migrate(&options.schema)?;
        Ok(PgStore {
            core: Arc::new(core),
        })
    }

    /// The schema that holds the store's tables.
    pub fn schema(&self) -> &str {
        &self.core.schema
    }

    /// How the batch writes of this store and of its fenced views shared transactions: see
    /// [`Combining`]. Cheap; for metrics and tests.
    pub fn combining(&self) -> Combining {
        self.core.combiner.counts()
    }
}

impl Core {
    fn migrate(&self, schema: &str) -> Result<(), OpenError> {
        let inner = &self.inner;
        let location = self.location.as_str();
        let migrated = self.run(inner.call_timeout(), async {
            let conn = inner.conn().await?;
            let result = crate::schema::migrate(&conn, &inner.sql, schema, location).await?;
            conn.release();
            Ok(result)
        });
        match migrated {
            Ok(result) => result,
            Err(failure) => Err(failure.into_open(location, "opening the store")),
        }
    }

    /// Runs `future` on the store's runtime, failing after `limit`.
    pub(crate) fn run<T>(
        &self,
        limit: Duration,
        future: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        self.run_unlimited(within(limit, future))
    }

    /// Runs `future` on the store's runtime; its own steps bound its time.
    pub(crate) fn run_unlimited<T>(
        &self,
        future: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        match &self.runtime {
            Some(runtime) => exec::block_on(runtime, future),
            None => Err(Failure::Corrupted(
                "the store was used while being dropped".to_owned(),
            )),
        }
    }
}

async fn get(inner: &Inner, key: Key<'_>) -> Result<Option<Vec<u8>>, Failure> {
    let conn = inner.conn().await?;
    let client = conn.client()?;
    let statement = client.prepare_cached(&inner.sql.kv.get).await?;
    let row = client
        .query_opt(&statement, &[&key.partition, &key.clustering])
        .await?;
    let value = row.map(|row| row.try_get::<_, Vec<u8>>(0)).transpose()?;
    conn.release();
    Ok(value)
}

async fn get_many(inner: &Inner, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, Failure> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let conn = inner.conn().await?;
    let values = read_many(inner, &conn, keys.iter().copied(), "get_many").await?;
    conn.release();
    Ok(values)
}

/// How one compare-and-swap attempt ended when the server answered.
enum Attempt {
    Swapped,
    /// The statement found another value (or the key present or absent against expectations).
    NotSwapped,
    /// The fence found another epoch; nothing was written.
    Fenced,
}

/// How a compare-and-swap ended when the server answered.
enum Swap {
    Swapped,
    /// The stored value at the time of the comparison.
    Mismatch(Option<Vec<u8>>),
    Fenced,
}

/// The conditional statement of a compare-and-swap with its parameters; `None` when there is
/// nothing to write (expected absent, asked to delete).
async fn cas_statement(
    inner: &Inner,
    conn: &Conn,
    expected: Option<&[u8]>,
    new: Option<&[u8]>,
) -> Result<Option<Statement>, Failure> {
    let client = conn.client()?;
    let text = match (expected, new) {
        (Some(_), Some(_)) => &inner.sql.kv.cas_update,
        (Some(_), None) => &inner.sql.kv.cas_delete,
        (None, Some(_)) => &inner.sql.kv.cas_insert,
        (None, None) => return Ok(None),
    };
    Ok(Some(client.prepare_cached(text).await?))
}

/// One compare-and-swap attempt. Without a fence it is one conditional statement in
/// autocommit; with one, `BEGIN`, the fence, the statement and `COMMIT` go in one round trip
/// (when the fence fails the transaction is aborted and `COMMIT` rolls it back).
async fn cas_attempt(
    inner: &Inner,
    conn: &Conn,
    key: Key<'_>,
    expected: Option<&[u8]>,
    new: Option<&[u8]>,
    fence: Option<&Fence>,
) -> Result<Attempt, Failure> {
    let Some(statement) = cas_statement(inner, conn, expected, new).await? else {
        return Ok(Attempt::NotSwapped);
    };
    let client = conn.client()?;
    let (p, c) = (key.partition, key.clustering);
    // $3 is the expected value when there is one, then the new value.
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![&p, &c];
    if let Some(expected) = &expected {
        params.push(expected);
    }
    if let Some(new) = &new {
        params.push(new);
    }
    let changed = match fence {
        None => client.execute(&statement, &params).await?,
        Some(fence) => {
            let check = fence.statement(inner, conn).await?;
            let (begin, held, changed, commit) = join4(
                client.batch_execute("BEGIN"),
                fence.check(conn, &check),
                client.execute(&statement, &params),
                client.batch_execute("COMMIT"),
            )
            .await;
            begin?;
            if !held? {
                commit?;
                return Ok(Attempt::Fenced);
            }
            let changed = changed?;
            commit?;
            changed
        }
    };
    Ok(match changed == 1 {
        true => Attempt::Swapped,
        false => Attempt::NotSwapped,
    })
}

/// Compare-and-swap.
///
/// Each statement is one conditional write that locks its row, so READ COMMITTED is enough:
/// an `UPDATE`/`DELETE … WHERE value = $expected` that meets a row changed by a concurrent
/// committed transaction re-checks its condition on the newest version, under the row lock,
/// before writing. On a mismatch the stored value is read right after; if that read finds the
/// expected value again (a concurrent writer changed it back), the swap is tried again.
async fn compare_and_swap(
    inner: &Inner,
    key: Key<'_>,
    expected: Option<&[u8]>,
    new: Option<&[u8]>,
    fence: Option<&Fence>,
) -> Result<Swap, Failure> {
    let conn = inner.conn().await?;
    for _ in 0..CAS_ATTEMPTS_MAX {
        match cas_attempt(inner, &conn, key, expected, new, fence).await? {
            Attempt::Swapped => {
                conn.release();
                return Ok(Swap::Swapped);
            }
            Attempt::Fenced => {
                conn.release();
                return Ok(Swap::Fenced);
            }
            Attempt::NotSwapped => {}
        }
        let client = conn.client()?;
        let statement = client.prepare_cached(&inner.sql.kv.get).await?;
        let row = client
            .query_opt(&statement, &[&key.partition, &key.clustering])
            .await?;
        let current = row.map(|row| row.try_get::<_, Vec<u8>>(0)).transpose()?;
        if current.as_deref() != expected {
            conn.release();
            return Ok(Swap::Mismatch(current));
        }
        if new.is_none() && expected.is_none() {
            // Expected absent, asked to delete: the read found it absent.
            conn.release();
            return Ok(Swap::Swapped);
        }
    }
    conn.release();
    Err(Failure::Corrupted(format!(
        "compare-and-swap lost {CAS_ATTEMPTS_MAX} races in a row against writers that kept \
         restoring the expected value; retry later"
    )))
}

/// The contract's operations, shared by [`PgStore`] (no fence) and [`FencedPgStore`].
impl Core {
    pub(crate) fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.run(self.inner.call_timeout(), get(&self.inner, key))
            .map_err(|f| f.into_kv("reading a key"))
    }

    pub(crate) fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.run(self.inner.call_timeout(), get_many(&self.inner, keys))
            .map_err(|f| f.into_kv("reading keys"))
    }

    pub(crate) fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.run_unlimited(crate::scan::scan(
            &self.inner,
            partition,
            from,
            to,
            order,
            visit,
        ))
        .map_err(|f| f.into_kv("scanning a partition"))
    }

    /// Writes `batch`, in a transaction that first checks `fence` when there is one: alone
    /// when a slot is free, else together with the other batches waiting (`combine.rs`).
    pub(crate) fn write(
        &self,
        batch: &WriteBatch,
        fence: Option<&Fence>,
    ) -> Result<(), WriteError> {
        batch.check_limits()?;
        if batch.is_empty() {
            return Ok(());
        }
        self.combiner.write(
            batch,
            fence,
            || self.write_alone(batch, fence),
            |key| self.settle(key),
        )
    }

    /// Writes `batch` in a transaction of its own, which first checks `fence` when there is
    /// one (`Core::write` carries concurrent batches together).
    pub(crate) fn write_alone(
        &self,
        batch: &WriteBatch,
        fence: Option<&Fence>,
    ) -> Result<(), WriteError> {
        batch.check_limits()?;
        if batch.is_empty() {
            return Ok(());
        }
        let plan = Plan::new(batch);
        let mut attempt = 1;
        loop {
            let applied = self.run(
                self.inner.call_timeout(),
                write::apply(&self.inner, &plan, fence),
            );
            match applied {
                Ok(Outcome::Written) => return Ok(()),
                Ok(Outcome::Conflict(index)) => {
                    let key = batch.get(index).map(|item| item.key.to_owned());
                    return Err(WriteError::Conflict {
                        index,
                        key: key.unwrap_or_default(),
                    });
                }
                Ok(Outcome::Fenced) => {
                    return Err(WriteError::Storage(self.fenced_error(fence)));
                }
                Err(failure) if failure.is_retryable() && attempt < WRITE_ATTEMPTS_MAX => {
                    std::thread::sleep(Duration::from_millis(1 << attempt));
                    attempt += 1;
                }
                Err(failure) if failure.outcome_unknown() => {
                    let key = batch.get(0).map(|item| item.key.to_owned());
                    let settled = key.is_some_and(|k| self.settle(k.as_key()));
                    return Err(WriteError::Storage(
                        failure.into_unknown("writing a batch", settled),
                    ));
                }
                Err(failure) => {
                    return Err(WriteError::Storage(
                        failure.into_kv("writing a batch, which was not written"),
                    ));
                }
            }
        }
    }

    /// Compare-and-swap, in a transaction that first checks `fence` when there is one.
    pub(crate) fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        fence: Option<&Fence>,
    ) -> Result<(), CasError> {
        if let Some((what, len, max)) = limits::exceeded(key, new.unwrap_or_default()) {
            return Err(CasError::TooLarge { what, len, max });
        }
        let mut attempt = 1;
        loop {
            let result = self.run(
                self.inner.call_timeout(),
                compare_and_swap(&self.inner, key, expected, new, fence),
            );
            match result {
                Ok(Swap::Swapped) => return Ok(()),
                Ok(Swap::Mismatch(current)) => return Err(CasError::Mismatch { current }),
                Ok(Swap::Fenced) => return Err(CasError::Storage(self.fenced_error(fence))),
                Err(failure) if failure.is_retryable() && attempt < WRITE_ATTEMPTS_MAX => {
                    std::thread::sleep(Duration::from_millis(1 << attempt));
                    attempt += 1;
                }
                Err(failure) if failure.outcome_unknown() => {
                    let settled = self.settle(key);
                    return Err(CasError::Storage(
                        failure.into_unknown("a compare-and-swap", settled),
                    ));
                }
                Err(failure) => {
                    return Err(CasError::Storage(
                        failure.into_kv("a compare-and-swap, which did not swap"),
                    ));
                }
            }
        }
    }

    /// Waits, on another connection, until no transaction still in flight writes `key`: a
    /// write whose answer was lost may still be running on the server (waiting for a lock, a
    /// flush or a synchronous standby), and a read before it ends would not tell its outcome.
    /// An insert of `key` where absent waits on the key's index entry for any transaction
    /// that inserts, updates or deletes it; it is then rolled back, so nothing is written.
    /// True when the wait ended within the call's time limit (reads now tell the outcome).
    pub(crate) fn settle(&self, key: Key<'_>) -> bool {
        let inner = &self.inner;
        self.run(inner.call_timeout(), async {
            let conn = inner.conn().await?;
            let client = conn.client()?;
            client.batch_execute("BEGIN").await?;
            let statement = client.prepare_cached(&inner.sql.kv.cas_insert).await?;
            let empty: &[u8] = b"";
            client
                .execute(&statement, &[&key.partition, &key.clustering, &empty])
                .await?;
            client.batch_execute("ROLLBACK").await?;
            conn.release();
            Ok(())
        })
        .is_ok()
    }

    /// The error of a write that `fence` refused, naming the lease's current holder.
    fn fenced_error(&self, fence: Option<&Fence>) -> KvError {
        match fence {
            Some(fence) => {
                fence.error(self.run(self.inner.call_timeout(), fence.holder(&self.inner)))
            }
            None => KvError::Corrupted {
                message: "an unfenced write was reported as fenced".to_owned(),
            },
        }
    }
}

impl KvStore for PgStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.core.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.core.get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.core.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.core.write(batch, None)
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.core.compare_and_swap(key, expected, new, None)
    }

    /// One transaction (one round trip, one commit) for several swaps (`swap_each.rs`).
    fn compare_and_swap_each(&self, swaps: &[monoseq_kv::Swap<'_>]) -> Vec<Result<(), CasError>> {
        self.core.compare_and_swap_each(swaps)
    }

    /// Does nothing: every commit returned is already durable (`synchronous_commit = on`).
    fn sync(&self) -> Result<(), KvError> {
        Ok(())
    }
}
