//! Creates or checks the store's tables at open, in one transaction: the schema, the meta
//! table with the recorded schema version, the key-value table, and the lease and node
//! tables. Owns the rules that a database of an older version is migrated in place (version
//! 1 gains the lease and node tables, version 2 the nodes' run IDs, version 3 the leases'
//! write counts, version 4 the nodes' directory identities) and that one written by a
//! newer build (a higher schema version) is refused, never used.

use monoseq_kv::{KvError, OpenError};
use tokio_postgres::error::SqlState;

use crate::error::{Failure, storage_open_error};
use crate::exec::Conn;
use crate::sql::{
    SCHEMA_VERSION, SCHEMA_VERSION_KV_ONLY, SCHEMA_VERSION_NO_DIR_ID, SCHEMA_VERSION_NO_RUN_ID,
    SCHEMA_VERSION_NO_WRITES, Sql, VERSION_ROW,
};

/// Attempts of the whole migration: two stores opening a new schema at once may race in the
/// catalog (`CREATE … IF NOT EXISTS` is not atomic there); the loser finds the tables on its
/// next attempt.
const MIGRATION_ATTEMPTS_MAX: u32 = 3;

/// Creates what is missing and checks the recorded version. The outer error is a fault (may be
/// retried), the inner one a refusal.
pub(crate) async fn migrate(
    conn: &Conn,
    sql: &Sql,
    schema: &str,
    location: &str,
) -> Result<Result<(), OpenError>, Failure> {
    let mut attempt = 1;
    loop {
        match migrate_once(conn, sql, schema, location).await {
            Err(failure) if attempt < MIGRATION_ATTEMPTS_MAX && is_catalog_race(&failure) => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn is_catalog_race(failure: &Failure) -> bool {
    match failure {
        Failure::Postgres(e) => {
            matches!(
                e.code(),
                Some(code) if *code == SqlState::UNIQUE_VIOLATION
                    || *code == SqlState::DUPLICATE_TABLE
                    || *code == SqlState::DUPLICATE_SCHEMA
                    || *code == SqlState::DUPLICATE_OBJECT
            ) || failure.is_retryable()
        }
        _ => false,
    }
}

async fn migrate_once(
    conn: &Conn,
    sql: &Sql,
    schema: &str,
    location: &str,
) -> Result<Result<(), OpenError>, Failure> {
    let client = conn.client()?;
    client.batch_execute("BEGIN").await?;
    let result = versioned(conn, sql, schema, location).await;
    match &result {
        Ok(Ok(())) => client.batch_execute("COMMIT").await?,
        _ => client.batch_execute("ROLLBACK").await?,
    }
    result
}

/// Creates the schema and meta table when missing, then brings the tables to
/// [`SCHEMA_VERSION`] from the version recorded there; refuses a version this build does not
/// read.
async fn versioned(
    conn: &Conn,
    sql: &Sql,
    schema: &str,
    location: &str,
) -> Result<Result<(), OpenError>, Failure> {
    ensure_schema(conn, sql, schema).await?;
    let client = conn.client()?;
    let row = client
        .query_opt(&sql.schema.read_version, &[&VERSION_ROW])
        .await?;
    let found: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
    match found {
        Some(version) if version == SCHEMA_VERSION => {}
        Some(SCHEMA_VERSION_KV_ONLY) => {
            create_lease_tables(conn, sql).await?;
            write_version(conn, sql).await?;
        }
        Some(SCHEMA_VERSION_NO_RUN_ID) => {
            client.batch_execute(&sql.schema.add_run_id).await?;
            client.batch_execute(&sql.schema.add_writes).await?;
            client.batch_execute(&sql.schema.add_dir_id).await?;
            write_version(conn, sql).await?;
        }
        Some(SCHEMA_VERSION_NO_WRITES) => {
            client.batch_execute(&sql.schema.add_writes).await?;
            client.batch_execute(&sql.schema.add_dir_id).await?;
            write_version(conn, sql).await?;
        }
        Some(SCHEMA_VERSION_NO_DIR_ID) => {
            client.batch_execute(&sql.schema.add_dir_id).await?;
            write_version(conn, sql).await?;
        }
        Some(version) => return Ok(Err(unreadable_version(version, location))),
        None => {
            client.batch_execute(&sql.schema.create_kv).await?;
            create_lease_tables(conn, sql).await?;
            write_version(conn, sql).await?;
        }
    }
    Ok(Ok(()))
}

/// Creates the schema (only when it is missing) and the meta table.
async fn ensure_schema(conn: &Conn, sql: &Sql, schema: &str) -> Result<(), Failure> {
    let client = conn.client()?;
    // CREATE SCHEMA needs the CREATE privilege on the database even when the schema exists:
    // only ask for it when it is missing.
    let exists = client
        .query_opt(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1",
            &[&schema],
        )
        .await?
        .is_some();
    if !exists {
        client.batch_execute(&sql.schema.create_schema).await?;
    }
    client.batch_execute(&sql.schema.create_meta).await?;
    Ok(())
}

/// The refusal of a recorded schema `version` that no migration starts from: one a newer build
/// wrote, or one no build wrote.
fn unreadable_version(version: i64, location: &str) -> OpenError {
    let source = if version > SCHEMA_VERSION {
        KvError::Backend {
            message: format!(
                "the database holds monoseq schema version {version}, newer than version \
                 {SCHEMA_VERSION} that this build reads; open it with the newer monoseq build \
                 that wrote it (downgrades are not supported)"
            ),
            source: None,
        }
    } else {
        KvError::Corrupted {
            message: format!(
                "the meta table records schema version {version}, which no monoseq build wrote \
                 (the first is {SCHEMA_VERSION_KV_ONLY}); the schema was changed by something \
                 else"
            ),
        }
    };
    storage_open_error(location, source)
}

async fn create_lease_tables(conn: &Conn, sql: &Sql) -> Result<(), Failure> {
    let client = conn.client()?;
    client.batch_execute(&sql.schema.create_leases).await?;
    client.batch_execute(&sql.schema.create_nodes).await?;
    Ok(())
}

async fn write_version(conn: &Conn, sql: &Sql) -> Result<(), Failure> {
    conn.client()?
        .execute(&sql.schema.write_version, &[&VERSION_ROW, &SCHEMA_VERSION])
        .await?;
    Ok(())
}
