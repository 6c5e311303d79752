//! The SQL a store runs, written once per schema at open: the table layout, the schema
//! version, and one statement text per operation (prepared and cached per connection). Owns
//! the rule that only constructs PostgreSQL-compatible distributed engines also run are used:
//! `INSERT … ON CONFLICT DO NOTHING`, `INSERT … ON CONFLICT … DO UPDATE`, conditional
//! `UPDATE`/`DELETE … WHERE`, `unnest` of arrays and `generate_series`, a data-modifying
//! `WITH … UPDATE … RETURNING` (the fence), and `SELECT … ORDER BY … FOR NO KEY UPDATE` (a
//! renewal locks its rows in order); no advisory locks, no `LISTEN`, no procedural functions.
//! Every lease time is the database's `now()`.

use std::ops::Bound;

use monoseq_kv::Order;

/// The schema version this build writes and reads. A database holding a newer one is refused.
/// Version 1: the key-value table. Version 2 adds the lease and node tables. Version 3 adds
/// the node table's `run_id` (which run of a node heartbeats under its name). Version 4 adds
/// the lease table's `writes` (fenced writes committed under the partition's leases, which
/// tells a fenced view that the database went back in time). Version 5 adds the node table's
/// `dir_id` (the identity of the directory whose lock the run held, which proves a restarted
/// run's predecessor dead). A database at an older version is migrated in place.
pub(crate) const SCHEMA_VERSION: i64 = 5;

/// The schema version whose node table has no `dir_id`.
pub(crate) const SCHEMA_VERSION_NO_DIR_ID: i64 = 4;

/// The schema version whose lease table has no `writes`.
pub(crate) const SCHEMA_VERSION_NO_WRITES: i64 = 3;

/// The schema version whose node table has no `run_id`.
pub(crate) const SCHEMA_VERSION_NO_RUN_ID: i64 = 2;

/// The schema version that had only the key-value table.
pub(crate) const SCHEMA_VERSION_KV_ONLY: i64 = 1;

/// Name of the row of the meta table that holds the schema version.
pub(crate) const VERSION_ROW: &str = "schema_version";

/// Statement texts of one store (one schema), by table.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Creating and migrating the tables, and the schema version.
    pub(crate) schema: SchemaSql,
    /// The key-value table.
    pub(crate) kv: KvSql,
    /// The lease table.
    pub(crate) leases: LeaseSql,
    /// The node table.
    pub(crate) nodes: NodeSql,
    /// Scans by `[lower][upper][descending]`, lower and upper as [`bound_index`] gives them.
    scans: [[[String; 2]; 3]; 3],
}

/// Statements that create and migrate the tables and keep the schema version.
#[derive(Debug)]
pub(crate) struct SchemaSql {
    pub(crate) create_schema: String,
    pub(crate) create_meta: String,
    pub(crate) create_kv: String,
    pub(crate) create_leases: String,
    pub(crate) create_nodes: String,
    /// Adds `run_id` to a node table of schema version 2.
    pub(crate) add_run_id: String,
    /// Adds `writes` to a lease table of schema version 3 or older.
    pub(crate) add_writes: String,
    /// Adds `dir_id` to a node table of schema version 4 or older.
    pub(crate) add_dir_id: String,
    pub(crate) read_version: String,
    pub(crate) write_version: String,
}

/// Statements on the key-value table.
#[derive(Debug)]
pub(crate) struct KvSql {
    pub(crate) get: String,
    pub(crate) get_many: String,
    /// Inserts rows whose keys must be absent: a present one fails the statement (23505).
    pub(crate) insert_new: String,
    pub(crate) upsert: String,
    pub(crate) delete: String,
    /// The keys of a list that are stored.
    pub(crate) stored_keys: String,
    pub(crate) cas_update: String,
    pub(crate) cas_delete: String,
    /// Inserts one key where absent (compare-and-swap from absence).
    pub(crate) cas_insert: String,
}

/// Statements on the lease table.
#[derive(Debug)]
pub(crate) struct LeaseSql {
    /// Divides by zero unless the lease of partition $1 has epoch $2 and counts at least $3
    /// writes; counts this write, locking the row to the commit; answers the new count.
    pub(crate) fence: String,
    /// The epoch and node of a lease.
    pub(crate) holder: String,
    /// Creates the free lease rows of partitions 0..$1.
    pub(crate) ensure: String,
    /// Takes lease $1 for node $2 for $3 ms when it is free or expired; returns its new epoch.
    pub(crate) acquire: String,
    /// Takes for node $2 for $3 ms each lease among partitions $1 that is free or expired,
    /// locking the rows in partition order (as `renew`); returns each partition taken and its
    /// new epoch.
    pub(crate) acquire_many: String,
    /// Extends for $4 ms the leases of node $1 among partitions $2 with epochs $3; returns the
    /// partitions extended. Locks the rows in partition order, as a combined write's fences
    /// do (`combine.rs`), so that the two never wait for each other in a cycle.
    pub(crate) renew: String,
    /// Heartbeats node $1 at URL $2 as run $3 (as [`NodeSql::heartbeat`], stale after $4 ms,
    /// but never taking the name by its directory) and, only when that was recorded, extends
    /// for $7 ms the leases of node $1 among
    /// partitions $5 with epochs $6 (as `renew`); returns whether the heartbeat was recorded
    /// and the partitions extended.
    pub(crate) heartbeat_renew: String,
    /// Frees lease $1 when node $2 holds it with epoch $3.
    pub(crate) release: String,
    /// Frees each lease of partitions $2 with epochs $3 that node $1 holds, rows locked as in
    /// `renew`; returns each partition freed.
    pub(crate) release_many: String,
    /// Every lease: partition, epoch, node, milliseconds to expiry by the database's clock.
    pub(crate) status: String,
}

/// Statements on the node table.
#[derive(Debug)]
pub(crate) struct NodeSql {
    /// Records node $1 at URL $2 as run $3 of directory $5 seen now, if the name is new, run
    /// $3's, last seen at least $4 ms ago, or recorded with directory $5 (not empty); returns a
    /// row when it did.
    pub(crate) heartbeat: String,
    pub(crate) leave: String,
    /// Every node: id, URL, milliseconds since its last heartbeat by the database's clock.
    pub(crate) status: String,
}

/// 0 unbounded, 1 included, 2 excluded.
fn bound_index<T>(bound: &Bound<T>) -> usize {
    match bound {
        Bound::Unbounded => 0,
        Bound::Included(_) => 1,
        Bound::Excluded(_) => 2,
    }
}

/// Milliseconds from the database's clock to the timestamp in `column` (negative when it is
/// past).
fn ms_until(column: &str) -> String {
    format!("CAST(floor(extract(epoch FROM ({column} - now())) * 1000) AS bigint)")
}

/// The qualified names of a store's tables.
struct Tables {
    kv: String,
    meta: String,
    leases: String,
    nodes: String,
}

impl Tables {
    fn new(schema: &str) -> Tables {
        Tables {
            kv: format!("{schema}.monoseq_kv"),
            meta: format!("{schema}.monoseq_meta"),
            leases: format!("{schema}.monoseq_leases"),
            nodes: format!("{schema}.monoseq_nodes"),
        }
    }
}

impl Sql {
    /// The statements of a store whose tables live in `schema` (a plain identifier, checked
    /// by the options).
    pub(crate) fn new(schema: &str) -> Sql {
        let tables = Tables::new(schema);
        let kv = &tables.kv;
        Sql {
            schema: SchemaSql::new(schema, &tables),
            kv: KvSql::new(kv),
            leases: LeaseSql::new(&tables.leases, &tables.nodes),
            nodes: NodeSql::new(&tables.nodes),
            scans: std::array::from_fn(|lower| {
                std::array::from_fn(|upper| {
                    std::array::from_fn(|descending| scan_sql(kv, lower, upper, descending == 1))
                })
            }),
        }
    }

    /// The scan statement for these bounds and order. Its parameters: the partition, then the
    /// lower bound's clustering if bounded, then the upper's if bounded, then the row limit.
    pub(crate) fn scan<T>(&self, lower: &Bound<T>, upper: &Bound<T>, order: Order) -> &str {
        let [l, u] = [bound_index(lower), bound_index(upper)];
        let descending = usize::from(order == Order::Descending);
        self.scans
            .get(l)
            .and_then(|s| s.get(u))
            .and_then(|s| s.get(descending))
            .map_or("", String::as_str)
    }
}

impl SchemaSql {
    fn new(schema: &str, tables: &Tables) -> SchemaSql {
        let Tables {
            kv,
            meta,
            leases,
            nodes,
        } = tables;
        SchemaSql {
            create_schema: format!("CREATE SCHEMA IF NOT EXISTS {schema}"),
            create_meta: format!(
                "CREATE TABLE IF NOT EXISTS {meta} (name text PRIMARY KEY, value bigint NOT NULL)"
            ),
            create_kv: format!(
                "CREATE TABLE IF NOT EXISTS {kv} (partition bytea NOT NULL, clustering bytea NOT \
                 NULL, value bytea NOT NULL, PRIMARY KEY (partition, clustering))"
            ),
            create_leases: format!(
                "CREATE TABLE IF NOT EXISTS {leases} (partition integer PRIMARY KEY, epoch bigint \
                 NOT NULL, node_id text NULL, expires_at timestamptz NOT NULL, writes bigint NOT \
                 NULL DEFAULT 0)"
            ),
            create_nodes: format!(
                "CREATE TABLE IF NOT EXISTS {nodes} (node_id text PRIMARY KEY, url text NOT NULL, \
                 seen_at timestamptz NOT NULL, run_id text NOT NULL DEFAULT '', dir_id text NOT \
                 NULL DEFAULT '')"
            ),
            add_run_id: format!(
                "ALTER TABLE {nodes} ADD COLUMN IF NOT EXISTS run_id text NOT NULL DEFAULT ''"
            ),
            add_writes: format!(
                "ALTER TABLE {leases} ADD COLUMN IF NOT EXISTS writes bigint NOT NULL DEFAULT 0"
            ),
            add_dir_id: format!(
                "ALTER TABLE {nodes} ADD COLUMN IF NOT EXISTS dir_id text NOT NULL DEFAULT ''"
            ),
            read_version: format!("SELECT value FROM {meta} WHERE name = $1 FOR UPDATE"),
            write_version: format!(
                "INSERT INTO {meta} (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE \
                 SET value = EXCLUDED.value"
            ),
        }
    }
}

impl KvSql {
    fn new(kv: &str) -> KvSql {
        let keys = "unnest($1::bytea[], $2::bytea[])";
        let rows = "unnest($1::bytea[], $2::bytea[], $3::bytea[])";
        KvSql {
            get: format!("SELECT value FROM {kv} WHERE partition = $1 AND clustering = $2"),
            // A lookup per key (a subquery, never a join): a join's plan, cached on a
            // connection while the table was small, reads the whole table on every call.
            get_many: format!(
                "SELECT k.n, (SELECT t.value FROM {kv} t WHERE t.partition = k.p AND \
                 t.clustering = k.c) FROM {keys} WITH ORDINALITY AS k (p, c, n)"
            ),
            insert_new: format!(
                "INSERT INTO {kv} (partition, clustering, value) SELECT * FROM {rows}"
            ),
            upsert: format!(
                "INSERT INTO {kv} (partition, clustering, value) SELECT * FROM {rows} ON CONFLICT \
                 (partition, clustering) DO UPDATE SET value = EXCLUDED.value"
            ),
            delete: format!(
                "DELETE FROM {kv} WHERE (partition, clustering) IN (SELECT * FROM {keys})"
            ),
            // As `get_many`: a lookup per key, whether it is stored.
            stored_keys: format!(
                "SELECT k.p, k.c, (SELECT true FROM {kv} t WHERE t.partition = k.p AND \
                 t.clustering = k.c) FROM {keys} AS k (p, c)"
            ),
            cas_update: format!(
                "UPDATE {kv} SET value = $4 WHERE partition = $1 AND clustering = $2 AND value = $3"
            ),
            cas_delete: format!(
                "DELETE FROM {kv} WHERE partition = $1 AND clustering = $2 AND value = $3"
            ),
            cas_insert: format!(
                "INSERT INTO {kv} (partition, clustering, value) VALUES ($1, $2, $3) ON CONFLICT \
                 (partition, clustering) DO NOTHING"
            ),
        }
    }
}

impl LeaseSql {
    fn new(leases: &str, nodes: &str) -> LeaseSql {
        let heartbeat = heartbeat_sql(nodes, false);
        // The leases of partitions $2 with epochs $3 that node $1 holds, locked in partition
        // order (as acquisitions and combined writes lock them).
        let held = format!(
            "SELECT partition FROM {leases} WHERE node_id = $1 AND (partition, epoch) IN (SELECT \
             * FROM unnest($2::integer[], $3::bigint[])) ORDER BY partition FOR NO KEY UPDATE"
        );
        LeaseSql {
            fence: format!(
                "WITH held AS (UPDATE {leases} SET writes = writes + 1 WHERE partition = $1 AND \
                 epoch = $2 AND writes >= $3 AND node_id = $4 RETURNING writes) SELECT \
                 1 / count(*), max(writes) FROM held"
            ),
            holder: format!("SELECT epoch, node_id FROM {leases} WHERE partition = $1"),
            ensure: format!(
                "INSERT INTO {leases} (partition, epoch, node_id, expires_at) SELECT p, 0, NULL, \
                 now() FROM generate_series(0, $1::integer - 1) AS p ORDER BY p ON CONFLICT \
                 (partition) DO NOTHING"
            ),
            acquire: format!(
                "UPDATE {leases} SET epoch = epoch + 1, node_id = $2, expires_at = now() + \
                 $3::bigint * interval '1 millisecond' WHERE partition = $1 AND (node_id IS NULL \
                 OR expires_at <= now()) RETURNING epoch"
            ),
            acquire_many: format!(
                "WITH free AS (SELECT partition FROM {leases} WHERE partition = ANY($1::integer[]) \
                 AND (node_id IS NULL OR expires_at <= now()) ORDER BY partition FOR NO KEY \
                 UPDATE) UPDATE {leases} l SET epoch = l.epoch + 1, node_id = $2, expires_at = \
                 now() + $3::bigint * interval '1 millisecond' FROM free WHERE l.partition = \
                 free.partition AND (l.node_id IS NULL OR l.expires_at <= now()) RETURNING \
                 l.partition, l.epoch"
            ),
            renew: format!(
                "WITH mine AS ({held}) UPDATE {leases} l SET expires_at = now() + $4::bigint * \
                 interval '1 millisecond' FROM mine WHERE l.partition = mine.partition RETURNING \
                 l.partition"
            ),
            heartbeat_renew: format!(
                "WITH hb AS ({heartbeat}), mine AS (SELECT partition FROM {leases} WHERE \
                 EXISTS (SELECT 1 FROM hb) AND node_id = $1 AND (partition, epoch) IN (SELECT * \
                 FROM unnest($5::integer[], $6::bigint[])) ORDER BY partition FOR NO KEY \
                 UPDATE), renewed AS (UPDATE {leases} l SET expires_at = now() + $7::bigint * \
                 interval '1 millisecond' FROM mine WHERE l.partition = mine.partition \
                 RETURNING l.partition) SELECT EXISTS (SELECT 1 FROM hb), ARRAY(SELECT partition \
                 FROM renewed ORDER BY partition)"
            ),
            release: format!(
                "UPDATE {leases} SET node_id = NULL, expires_at = now() WHERE partition = $1 AND \
                 node_id = $2 AND epoch = $3"
            ),
            release_many: format!(
                "WITH mine AS ({held}) UPDATE {leases} l SET node_id = NULL, expires_at = now() \
                 FROM mine WHERE l.partition = mine.partition RETURNING l.partition"
            ),
            status: format!(
                "SELECT partition, epoch, node_id, {} FROM {leases} ORDER BY partition",
                ms_until("expires_at")
            ),
        }
    }
}

impl NodeSql {
    fn new(nodes: &str) -> NodeSql {
        NodeSql {
            heartbeat: heartbeat_sql(nodes, true),
            leave: format!("DELETE FROM {nodes} WHERE node_id = $1 AND run_id = $2"),
            status: format!(
                "SELECT node_id, url, -{}, run_id, dir_id FROM {nodes} ORDER BY node_id",
                ms_until("seen_at")
            ),
        }
    }
}

/// The heartbeat of node $1 at URL $2 as run $3, stale after $4 ms. `claim`: a run claiming
/// its name, its directory's identity in $5, which also takes a name recorded with that
/// identity (not empty); otherwise a member's, which keeps the identity its run claimed with
/// (and records none when it takes a stale name over).
fn heartbeat_sql(nodes: &str, claim: bool) -> String {
    let (dir, set_dir, dead) = if claim {
        (
            "$5",
            "EXCLUDED.dir_id".to_owned(),
            format!(" OR ({nodes}.dir_id = EXCLUDED.dir_id AND EXCLUDED.dir_id <> '')"),
        )
    } else {
        (
            "''",
            format!("CASE WHEN {nodes}.run_id = EXCLUDED.run_id THEN {nodes}.dir_id ELSE '' END"),
            String::new(),
        )
    };
    format!(
        "INSERT INTO {nodes} (node_id, url, seen_at, run_id, dir_id) VALUES ($1, $2, now(), $3, \
         {dir}) ON CONFLICT (node_id) DO UPDATE SET url = EXCLUDED.url, seen_at = \
         EXCLUDED.seen_at, run_id = EXCLUDED.run_id, dir_id = {set_dir} WHERE {nodes}.run_id = \
         EXCLUDED.run_id OR {nodes}.seen_at <= now() - $4::bigint * interval '1 \
         millisecond'{dead} RETURNING 1"
    )
}

fn scan_sql(kv: &str, lower: usize, upper: usize, descending: bool) -> String {
    let mut sql = format!("SELECT clustering, value FROM {kv} WHERE partition = $1");
    let mut param = 1;
    for (index, ops) in [(lower, [">=", ">"]), (upper, ["<=", "<"])] {
        if index > 0 {
            param += 1;
            let op = if index == 1 { ops[0] } else { ops[1] };
            sql.push_str(&format!(" AND clustering {op} ${param}"));
        }
    }
    let order = if descending { "DESC" } else { "ASC" };
    sql.push_str(&format!(
        " ORDER BY clustering {order} LIMIT ${}",
        param + 1
    ));
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scan_statements_number_their_parameters_by_the_bounds_present() {
        let sql = Sql::new("s");
        assert_eq!(
            sql.scan::<&[u8]>(&Bound::Unbounded, &Bound::Unbounded, Order::Ascending),
            "SELECT clustering, value FROM s.monoseq_kv WHERE partition = $1 ORDER BY clustering \
             ASC LIMIT $2"
        );
        assert_eq!(
            sql.scan(&Bound::Excluded(1), &Bound::Included(2), Order::Descending),
            "SELECT clustering, value FROM s.monoseq_kv WHERE partition = $1 AND clustering > $2 \
             AND clustering <= $3 ORDER BY clustering DESC LIMIT $4"
        );
        assert_eq!(
            sql.scan(&Bound::Unbounded, &Bound::Excluded(2), Order::Ascending),
            "SELECT clustering, value FROM s.monoseq_kv WHERE partition = $1 AND clustering < $2 \
             ORDER BY clustering ASC LIMIT $3"
        );
    }
}
