//! The store on MySQL 8 and MariaDB 10.11.
//!
//! MySQL has no `RETURNING` on an upsert, and sqlx connects with `CLIENT_FOUND_ROWS`,
//! so "inserted" and "conflict, left unchanged" both report one affected row. The
//! claim therefore decides ownership by the fence: the upsert's `fence` assignment
//! calls `LAST_INSERT_ID(…)` on both of its branches, which the server returns with
//! the result:
//!
//! | rows affected | last insert id | meaning |
//! |---|---|---|
//! | 1 | n ≥ 1 | inserted: fence n, the server's instant in microseconds, is its `created_at` |
//! | 2 | n | taken over or re-claimed after expiry: fence n |
//! | 0 or 1 | 0 | refused: the record stands |
//!
//! MySQL evaluates `ON DUPLICATE KEY UPDATE` assignments left to right, each seeing the
//! columns already assigned. The grant condition reads `status`, `expires_at`,
//! `lease_until` and `fingerprint`; those are assigned last, in an order that keeps the
//! condition's value (see the comment in `build`). A finished record's `lease_until`
//! is its completion time, never NULL, which that order relies on.

use std::sync::Arc;
use std::time::Duration;

use chrono::NaiveDateTime;
use idem_runtime::{Claim, Lease, StoreError};
use sqlx::mysql::{MySqlConnection, MySqlDatabaseError, MySqlPool, MySqlQueryResult};
use sqlx::Row;

use crate::claim::{FirstClaim, Inserted};
use crate::connection::connect;
use crate::dialect::{derived_identifier, judged_by, on_table, renamed, Dialect, Parts, Stored, Upserted};
use crate::error::driver_error;
use crate::migration::{create_table, statements, ColumnTypes, STATUS_CHECK};
use crate::row::read_in_insert;
use crate::shape::{length, split_table, Column, Need, UniqueKey};
use crate::statements::{strippable, ServerClock, StatementClock, Statements, STRIPPED};
use crate::store_api::{impl_record_pages, impl_store_api};
use crate::store_impl::{bind_claim, impl_idempotency_store};
use crate::table::DEFAULT_TABLE;
use crate::transaction::impl_transaction_database;

/// Idempotency records in MySQL or MariaDB, instants as UTC `DATETIME(6)`.
///
/// On a MariaDB Galera cluster (any node, or a proxy in front of them) the store needs
/// no setting of its own: a claim that loses to another node's write of the key (the
/// server rolls it back at certification, `ERROR 1213`) reads the winner's record and
/// answers with it, holder writes rolled back that way run again, and every read waits
/// until the node has applied what the cluster committed before it (`SET STATEMENT
/// wsrep_sync_wait = 1 FOR SELECT …`), so a duplicate sent to another node replays the
/// first answer. A holder write the node refuses is run again the same way (`= 2 FOR
/// UPDATE …`): a node that lags behind the cluster may not have the claim yet, and its
/// refusal would drop a finished call's outcome. See `docs/RELIABILITY.md` ("Clusters").
#[derive(Debug, Clone)]
pub struct MySqlStore {
    parts: Parts<sqlx::MySql>,
}

/// [`COLUMNS`] with the key columns converted to the connection's character set:
/// their binary collation makes sqlx see bytes, not text.
const SELECT_COLUMNS: &str = "CONVERT(biz_type USING utf8mb4), CONVERT(idempotent_key USING utf8mb4), status, fence, \
     fingerprint, request_body, response_body, error_message, lease_until, created_at, completed_at, expires_at, steps, \
     subject, replay_until, tombstone";

/// The claim rule over the row's current values; `VALUES(created_at)`
/// is the claim's `now`.
const GRANTED: &str = "(expires_at <= VALUES(created_at) OR (status = 'PROCESSING' \
     AND lease_until <= VALUES(created_at) AND (fingerprint IS NULL OR VALUES(fingerprint) IS NULL \
     OR fingerprint = VALUES(fingerprint))))";

/// After the other assignments, a grant by expiry of a record whose `lease_until` was
/// NULL: the new life's `created_at` and `expires_at` are in place, the lease is not.
/// A row with the key already there.
const ER_DUP_ENTRY: u16 = 1062;

const GRANTED_BY_EXPIRY_WITHOUT_LEASE: &str = "(lease_until IS NULL AND status = 'PROCESSING' \
     AND created_at = VALUES(created_at) AND expires_at = VALUES(expires_at))";

impl MySqlStore {
    /// A store on the application's own pool, using the table `idempotent_record`.
    pub fn new(pool: MySqlPool) -> Self {
        on_table(pool, DEFAULT_TABLE.to_owned())
    }

    /// Connect a pool to `url` (`mysql://user:pass@host/db`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Ok(Self::new(connect(url, "MySQL").await?))
    }

    /// Use the table `name` instead (`table` or `database.table`).
    pub fn with_table_name(self, name: &str) -> Result<Self, StoreError> {
        renamed(self, name)
    }

    /// Judge leases, expiry and grants by `clock`. The default,
    /// [`LeaseClock::Store`](idem_runtime::LeaseClock::Store), reads the server's clock
    /// in every statement, so application hosts whose clocks disagree agree on every
    /// lease; [`LeaseClock::Caller`](idem_runtime::LeaseClock::Caller) takes the
    /// caller's instants (which follow tokio's paused clock) — for tests that move time
    /// against a real server, never for more than one host.
    pub fn with_lease_clock(self, clock: idem_runtime::LeaseClock) -> Self {
        judged_by(self, clock)
    }

    /// The DDL `migrate` runs, for this store's table and server: one `CREATE TABLE`
    /// with its `expires_at` index, ending with `;` (keys in MariaDB's
    /// `utf8mb4_nopad_bin` collation, or MySQL 8's `utf8mb4_0900_bin`). What `idem
    /// migrate --print` prints, and, for the default table, `migrations/mariadb.sql`
    /// and `migrations/mysql.sql`: for teams that keep their schema in migration files.
    pub async fn migration_sql(&self) -> Result<String, StoreError> {
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&self.parts.pool)
            .await
            .map_err(|e| driver_error("reading the server version", e))?;
        Ok(self.migration_sql_for(version.contains("MariaDB")))
    }

    /// [`migration_sql`](Self::migration_sql) for a MariaDB server (`mariadb`) or a
    /// MySQL 8 one.
    pub fn migration_sql_for(&self, mariadb: bool) -> String {
        let exact = if mariadb {
            "utf8mb4_nopad_bin"
        } else {
            "utf8mb4_0900_bin"
        };
        let exact_key = |length| format!("VARCHAR({length}) CHARACTER SET utf8mb4 COLLATE {exact}");
        let (biz, key) = (exact_key(64), exact_key(255));
        let types = ColumnTypes {
            biz: &biz,
            key: &key,
            status: "VARCHAR(16)",
            fence: "BIGINT",
            fingerprint: "VARCHAR(64)",
            long_text: "LONGTEXT",
            error_message: "TEXT",
            instant: "DATETIME(6)",
            nullable: " NULL",
            watched: None,
        };
        let name = &self.parts.sql.table;
        let extra = [
            format!("KEY {} (expires_at)", derived_identifier::<Self>(name, "expires_at")),
            format!("KEY {} (subject)", derived_identifier::<Self>(name, "subject")),
            format!(
                "CONSTRAINT {} {STATUS_CHECK}",
                derived_identifier::<Self>(name, "status")
            ),
        ];
        create_table(
            &self.parts.sql.quoted,
            &types,
            false,
            &extra,
            " ENGINE = InnoDB DEFAULT CHARSET = utf8mb4",
        )
    }

    /// Create the table (with its `expires_at` index) if it does not exist, then check
    /// its columns. Keys compare byte for byte, trailing spaces included (a binary,
    /// no-pad collation). Writes nothing to the application's `_sqlx_migrations`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let ddl = self.migration_sql().await?;
        let created = async {
            for statement in statements(&ddl) {
                sqlx::query(statement)
                    .execute(&self.parts.pool)
                    .await
                    .map_err(|e| driver_error("creating the idempotency table", e))?;
            }
            Ok(())
        };
        self.migrate_table(created).await
    }
    /// What the claim statement's counts say; a takeover is confirmed by `read`ing the
    /// record (its life's `created_at`).
    async fn upserted<R, F>(claim: &Claim<'_>, done: &MySqlQueryResult, read: R) -> Result<Upserted, StoreError>
    where
        R: FnOnce() -> F,
        F: std::future::Future<Output = Result<Option<idem_runtime::Record>, StoreError>>,
    {
        match (done.rows_affected(), done.last_insert_id()) {
            (1, fence) if fence > 0 => Ok(Upserted::Granted(first_life(claim, fence))),
            (2, fence) => {
                // Granted on an existing row; a takeover kept the row's `created_at`.
                match read().await? {
                    Some(record) if record.fence == fence => Ok(Upserted::Granted(Lease::new(
                        claim.biz,
                        claim.key,
                        fence,
                        record.created_at,
                    ))),
                    other => Err(StoreError::new(format!(
                        "claim of biz `{}` key `{}` was granted fence {fence} but the record reads {:?}",
                        claim.biz,
                        claim.key,
                        other.map(|record| record.fence)
                    ))),
                }
            }
            _ => Ok(Upserted::Refused(None)),
        }
    }
}

/// The lease of a record the claim inserted: its fence is its `created_at` (the
/// server's instant) in microseconds since the epoch.
fn first_life(claim: &Claim<'_>, fence: u64) -> Lease {
    Lease::new(
        claim.biz,
        claim.key,
        fence,
        std::time::UNIX_EPOCH + Duration::from_micros(fence),
    )
}

impl Dialect for MySqlStore {
    type Stamp = NaiveDateTime;
    type LockWait = ();
    const QUOTE: char = '`';
    const NUMBERED: bool = false;
    const GREATEST: &'static str = "GREATEST";
    const COLUMNS: &'static str = SELECT_COLUMNS;
    const BIZ_TEXT: &'static str = "CONVERT(biz_type USING utf8mb4)";
    const LOCKING_READ: &'static str = " LOCK IN SHARE MODE";
    // UTC, to the microsecond; the same instant throughout a statement.
    const SERVER_CLOCK: Option<ServerClock> = Some(ServerClock {
        now: "UTC_TIMESTAMP(6)",
        after: "TIMESTAMPADD(MICROSECOND, ?, UTC_TIMESTAMP(6))",
        epoch_micros: "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))",
    });

    fn claim_statement(table: &str, clock: StatementClock) -> String {
        // Order matters: first the columns the condition does not read; then
        // `fingerprint` (granted, it still agrees with the claim's), `status` (granted,
        // PROCESSING, as a takeover found it), `expires_at` (a grant by expiry still
        // holds as a lapsed PROCESSING lease: an expired record's lease ended before it
        // expired) and last `lease_until`. A record that expired with no lease at all
        // (written by hand) no longer meets the condition there; it is known by the new
        // life its `created_at` and `expires_at` were just given.
        // On the server's clock the claim binds only the lengths of the lease and of
        // the record; on the caller's, its instants and first fence.
        let (lease_until, expires_at) = (clock.after("?"), clock.after("?"));
        let (now, first_fence) = clock.0.map_or(("?", "?"), |server| (server.now, server.epoch_micros));
        format!(
            "INSERT INTO {table} (biz_type, idempotent_key, status, fingerprint, request_body, \
               lease_until, created_at, expires_at, fence) \
             VALUES (?, ?, 'PROCESSING', ?, ?, {lease_until}, {now}, {expires_at}, LAST_INSERT_ID({first_fence})) \
             ON DUPLICATE KEY UPDATE \
               fence = IF({GRANTED}, \
                 LAST_INSERT_ID(IF(expires_at <= VALUES(created_at), GREATEST(fence + 1, VALUES(fence)), fence + 1)), \
                 fence + LAST_INSERT_ID(0)), \
               request_body = IF({GRANTED}, VALUES(request_body), request_body), \
               response_body = IF({GRANTED}, NULL, response_body), \
               error_message = IF({GRANTED}, NULL, error_message), \
               completed_at = IF({GRANTED}, NULL, completed_at), \
               steps = IF({GRANTED}, IF(expires_at <= VALUES(created_at), NULL, steps), steps), \
               created_at = IF({GRANTED} AND expires_at <= VALUES(created_at), VALUES(created_at), created_at), \
               fingerprint = IF({GRANTED}, IF(expires_at <= VALUES(created_at), VALUES(fingerprint), \
                                COALESCE(VALUES(fingerprint), fingerprint)), fingerprint), \
               status = IF({GRANTED}, 'PROCESSING', status), \
               expires_at = IF({GRANTED}, VALUES(expires_at), expires_at), \
               lease_until = IF({GRANTED} OR {GRANTED_BY_EXPIRY_WITHOUT_LEASE}, VALUES(lease_until), lease_until)"
        )
    }

    /// The claim's own `INSERT`, without its `ON DUPLICATE KEY UPDATE`: on MariaDB and
    /// MySQL that clause costs a first claim as much as a round trip, even when no
    /// record is in the way. A record that is there fails it with a duplicate key, and
    /// changes nothing.
    fn insert_statement(table: &str, clock: StatementClock) -> Option<String> {
        let claim = Self::claim_statement(table, clock);
        let (insert, _) = claim
            .split_once(" ON DUPLICATE KEY UPDATE")
            .expect("the claim is an INSERT … ON DUPLICATE KEY UPDATE");
        Some(insert.to_owned())
    }

    async fn insert_if_absent(
        conn: &mut MySqlConnection,
        insert: FirstClaim<'_>,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> Result<Inserted, StoreError> {
        if insert.reads {
            let row = bind_claim!(sql.query(insert.sql), sql.server_clock, claim)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| driver_error("claim", e))?;
            let granted: u64 = row
                .try_get(crate::shape::WRITTEN.len() + 1)
                .map_err(|e| driver_error("claim", e))?;
            return match granted {
                0 => read_in_insert::<_, NaiveDateTime>(&row, sql.server_clock),
                fence => Ok(Inserted::Granted(first_life(claim, fence))),
            };
        }
        match bind_claim!(sql.query(insert.sql), sql.server_clock, claim)
            .execute(&mut *conn)
            .await
        {
            Ok(done) => Ok(Inserted::Granted(first_life(claim, done.last_insert_id()))),
            Err(sqlx::Error::Database(db))
                if db
                    .try_downcast_ref::<MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == ER_DUP_ENTRY) =>
            {
                Ok(Inserted::Unread)
            }
            Err(error) => Err(driver_error("claim", error)),
        }
    }

    fn purge_statement(table: &str, clock: StatementClock) -> String {
        let now = clock.now();
        format!(
            "DELETE FROM {table} WHERE expires_at <= {now} AND (status <> 'PROCESSING' OR lease_until <= {now}) \
             ORDER BY expires_at LIMIT ?"
        )
    }

    fn strip_statement(table: &str, clock: StatementClock) -> String {
        format!(
            "UPDATE {table} SET {STRIPPED}, tombstone = 'EXPIRED' WHERE {} ORDER BY replay_until LIMIT ?",
            strippable(clock.now())
        )
    }

    const PURGE_REPEATS_NOW: bool = true;

    const ADDED_COLUMNS: &'static [(&'static str, &'static str)] = &[
        ("steps", "LONGTEXT NULL"),
        ("subject", "VARCHAR(64) NULL"),
        ("replay_until", "DATETIME(6) NULL"),
        ("tombstone", "VARCHAR(16) NULL"),
    ];

    /// The subject's index comes with its column, in the same statement.
    fn add_column_sql(name: &str, quoted: &str, column: &str, ty: &str) -> String {
        let index = match column {
            "subject" => format!(", ADD KEY {} (subject)", derived_identifier::<Self>(name, "subject")),
            _ => String::new(),
        };
        format!("ALTER TABLE {quoted} ADD COLUMN {column} {ty}{index}")
    }

    /// What the statements need of each column on MySQL and MariaDB.
    const NEEDS: &'static [Need] = &[
        Need::new("biz_type", EXACT_KEY, exact_key),
        Need::new("idempotent_key", EXACT_KEY, exact_key),
        Need::new("status", "VARCHAR(10) or longer", |c| text_of_at_least(c, 10)),
        Need::new("fence", "BIGINT", |c| c.declared.starts_with("bigint")),
        Need::new("fingerprint", "VARCHAR(64) or longer", |c| text_of_at_least(c, 64)),
        Need::new("request_body", "MEDIUMTEXT or LONGTEXT", |c| {
            matches!(c.declared.as_str(), "mediumtext" | "longtext")
        }),
        Need::new("response_body", "LONGTEXT", |c| c.declared == "longtext"),
        Need::new("error_message", "TEXT, MEDIUMTEXT or LONGTEXT", |c| {
            c.declared.ends_with("text")
        }),
        Need::new("lease_until", DATETIME6, datetime6),
        Need::new("created_at", DATETIME6, datetime6),
        Need::new("completed_at", DATETIME6, datetime6),
        Need::new("expires_at", DATETIME6, datetime6),
        Need::new("steps", "MEDIUMTEXT or LONGTEXT", |c| {
            matches!(c.declared.as_str(), "mediumtext" | "longtext")
        }),
        Need::new("subject", "VARCHAR(64) or longer", |c| text_of_at_least(c, 64)),
        Need::new("replay_until", DATETIME6, datetime6),
        Need::new("tombstone", "VARCHAR(8) or longer", |c| text_of_at_least(c, 8)),
    ];

    /// The table's columns and unique keys, from `information_schema`.
    async fn read_shape(&self) -> Result<(Vec<Column>, Vec<UniqueKey>), StoreError> {
        let (schema, name) = split_table(&self.parts.sql.table);
        let failed = |e| driver_error("reading the idempotency table's shape", e);
        // name, type, collation, nullable, default, extra
        type ColumnRow = (String, String, Option<String>, String, Option<String>, String);
        let rows: Vec<ColumnRow> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), CAST(COLLATION_NAME AS CHAR), \
               CAST(IS_NULLABLE AS CHAR), CAST(COLUMN_DEFAULT AS CHAR), CAST(EXTRA AS CHAR) \
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? \
             ORDER BY ORDINAL_POSITION",
        )
        .bind(schema)
        .bind(name)
        .fetch_all(&self.parts.pool)
        .await
        .map_err(failed)?;
        let columns = rows
            .into_iter()
            .map(|(name, declared, collation, nullable, default, extra)| Column {
                name,
                declared: declared.to_ascii_lowercase(),
                collation,
                nullable: nullable == "YES",
                has_default: default.is_some(),
                auto_increment: extra.to_ascii_lowercase().contains("auto_increment"),
            })
            .collect();
        let keys: Vec<(String,)> = sqlx::query_as(
            "SELECT CAST(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) AS CHAR) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ? AND NON_UNIQUE = 0 GROUP BY INDEX_NAME",
        )
        .bind(schema)
        .bind(name)
        .fetch_all(&self.parts.pool)
        .await
        .map_err(failed)?;
        let keys = keys
            .into_iter()
            .map(|(columns,)| {
                let columns: Vec<String> = columns.split(',').map(str::to_owned).collect();
                let collations = vec![None; columns.len()];
                UniqueKey { columns, collations }
            })
            .collect();
        Ok((columns, keys))
    }

    /// The statement's counts say whether it granted; a takeover is confirmed by
    /// reading the record with `get` (its life's `created_at`).
    async fn upsert(
        conn: &mut MySqlConnection,
        upsert: &str,
        get: &str,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> Result<Upserted, StoreError> {
        let done = bind_claim!(sql.query(upsert), sql.server_clock, claim)
            .execute(&mut *conn)
            .await
            .map_err(|e| driver_error("claim", e))?;
        Self::upserted(claim, &done, move || Self::read(conn, sql, get, claim.biz, claim.key)).await
    }

    /// Bound the claim's wait for another transaction's lock by the session's
    /// `innodb_lock_wait_timeout` (whole seconds, rounded up), kept in `@idem_wait` to
    /// restore. A lock wait timeout rolls back the statement alone.
    async fn lock_wait_begin(conn: &mut MySqlConnection, wait: Duration) -> Result<(), StoreError> {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        sqlx::Executor::execute(
            &mut *conn,
            format!(
                "SET @idem_wait = @@SESSION.innodb_lock_wait_timeout, SESSION innodb_lock_wait_timeout = {}",
                seconds.clamp(1, 1_073_741_824)
            )
            .as_str(),
        )
        .await
        .map(drop)
        .map_err(|e| driver_error("bounding the claim's lock wait", e))
    }

    /// Restore the session's `innodb_lock_wait_timeout`.
    async fn lock_wait_end(conn: &mut MySqlConnection, _restore: (), _claimed: bool) -> Result<(), StoreError> {
        sqlx::Executor::execute(&mut *conn, "SET SESSION innodb_lock_wait_timeout = @idem_wait")
            .await
            .map(drop)
            .map_err(|e| driver_error("restoring innodb_lock_wait_timeout", e))
    }

    /// ER_LOCK_WAIT_TIMEOUT.
    fn is_lock_wait(error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Database(db)
            if db.try_downcast_ref::<MySqlDatabaseError>().is_some_and(|e| e.number() == 1205))
    }

    fn rows_changed(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }

    /// MariaDB 10.5 and later return rows from an `INSERT` (`RETURNING`): there a claim
    /// may read the record in its way in its own statement — but not on a Galera
    /// node, whose reads of a record must wait for the other nodes' commits.
    ///
    /// A Galera node (`wsrep_on`) applies other nodes' commits after they return: reads
    /// wait for them (`wsrep_sync_wait`, per statement on MariaDB; MySQL-based
    /// clusters have no per-statement form and are told to set it for the session).
    async fn learn_server(&self) -> Result<(), StoreError> {
        let settings: Vec<(String, String)> =
            sqlx::query_as("SHOW VARIABLES WHERE Variable_name IN ('wsrep_on', 'version')")
                .fetch_all(&self.parts.pool)
                .await
                .map_err(|e| driver_error("reading the server's settings", e))?;
        let setting = |name: &str| settings.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        let galera = setting("wsrep_on").is_some_and(|on| on.eq_ignore_ascii_case("ON"));
        if !galera && setting("version").is_some_and(returns_from_insert) {
            let table = crate::table::quoted(&self.parts.sql.table, Self::QUOTE);
            let clock = StatementClock::of::<Self>(self.lease_clock());
            let _ = self
                .parts
                .insert_and_read_sql
                .set(insert_and_read(&table, clock).into());
        }
        if galera {
            if setting("version").is_some_and(|v| v.contains("MariaDB")) {
                let _ = self.parts.causal.set(Arc::new(causal(&self.parts.sql)));
            } else {
                tracing::warn!(target: "idem", "the MySQL server is a Galera node: set wsrep_sync_wait = 3 for idem's connections, or a \
                     duplicate sent to another node may see the first call's record late, and a holder's write may be refused \
                     on a node that has not applied its claim yet"
                );
            }
        }
        Ok(())
    }
}

/// `sql` with its read of a record and its holder writes waiting, each, until the
/// Galera node has applied what the cluster committed before it (`wsrep_sync_wait`: 1
/// for a `SELECT`, 2 for an `UPDATE` or a `DELETE`).
fn causal(sql: &Statements) -> Statements {
    let wait = |bit: u8, statement: &str| format!("SET STATEMENT wsrep_sync_wait = {bit} FOR {statement}");
    Statements {
        get: wait(1, &sql.get),
        renew: wait(2, &sql.renew),
        complete: wait(2, &sql.complete),
        fail: wait(2, &sql.fail),
        release: wait(2, &sql.release),
        park: wait(2, &sql.park),
        record_steps: wait(2, &sql.record_steps),
        ..sql.clone()
    }
}

/// Whether the server of `version` returns rows from an `INSERT`: MariaDB 10.5 on.
fn returns_from_insert(version: &str) -> bool {
    let mut numbers = version.split(['.', '-']).map(|part| part.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    version.contains("MariaDB") && (major, minor) >= (10, 5)
}

/// The claim's plain insert that, meeting a record, changes nothing and returns it —
/// its columns as `get` reads them, the server's instant, then `LAST_INSERT_ID()`:
/// the new record's fence when it inserted one, `0` when one stood. (MariaDB's
/// `RETURNING` returns the row an `ON DUPLICATE KEY UPDATE` left.) Binds as the plain
/// insert.
fn insert_and_read(table: &str, clock: StatementClock) -> String {
    let insert = MySqlStore::insert_statement(table, clock).expect("MySQL has a plain insert");
    format!(
        "{insert} ON DUPLICATE KEY UPDATE fence = fence + LAST_INSERT_ID(0) \
         RETURNING {SELECT_COLUMNS}, UTC_TIMESTAMP(6), LAST_INSERT_ID()"
    )
}

impl_idempotency_store!(MySqlStore, sqlx::MySql);
impl_store_api!(MySqlStore, sqlx::MySql);
impl_record_pages!(MySqlStore);
impl_transaction_database!(MySqlStore, sqlx::MySql, "MySQL");

const EXACT_KEY: &str =
    "VARCHAR with a binary no-pad collation (utf8mb4_nopad_bin on MariaDB, utf8mb4_0900_bin on MySQL), or VARBINARY";
const DATETIME6: &str = "DATETIME(6) (microseconds: a holder's writes match its lease to the microsecond)";

/// Keys compare byte for byte, trailing spaces included.
fn exact_key(column: &Column) -> bool {
    let no_pad_binary =
        |collation: &str| collation.ends_with("_nopad_bin") || collation == "utf8mb4_0900_bin" || collation == "binary";
    column.declared.starts_with("varbinary")
        || (column.declared.starts_with("varchar") && column.collation.as_deref().is_some_and(no_pad_binary))
}

fn datetime6(column: &Column) -> bool {
    column.declared == "datetime(6)"
}

fn text_of_at_least(column: &Column, chars: u64) -> bool {
    let declared = column.declared.as_str();
    declared.ends_with("text")
        || ((declared.starts_with("varchar") || declared.starts_with("char"))
            && length(declared).is_some_and(|n| n >= chars))
}

#[cfg(test)]
mod tests {
    use super::returns_from_insert;

    #[test]
    fn only_mariadb_from_10_5_returns_rows_from_an_insert() {
        assert!(returns_from_insert("10.11.19-MariaDB-0+deb12u1"));
        assert!(returns_from_insert("10.5.0-MariaDB"));
        assert!(returns_from_insert("11.4.2-MariaDB-log"));
        assert!(!returns_from_insert("10.4.32-MariaDB"));
        assert!(
            !returns_from_insert("5.5.5-10.11.6-MariaDB"),
            "the old replication prefix reads as 5.5"
        );
        assert!(!returns_from_insert("8.0.36"));
        assert!(!returns_from_insert("8.4.0-commercial"));
    }
}
