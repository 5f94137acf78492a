//! The store on PostgreSQL.

use std::time::Duration;

use chrono::{DateTime, Utc};
use idem_runtime::notice::Notice;
use idem_runtime::{Claim, StoreError};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::Row;

use crate::claim::{FirstClaim, Inserted};
use crate::connection::{connect_checked, connecting, Check};
use crate::dialect::{behind, derived_identifier, judged_by, on_table, renamed, Dialect, Parts, Stored, Upserted};
use crate::error::{driver_error, refused};
use crate::migration::{create_table, partial_indexes, statements, ColumnTypes};
use crate::pooler::{on_pool, Pooler};
use crate::row::{granted_lease, read_in_insert, record_from_row};
use crate::shape::{length, Column, Need, UniqueKey};
use crate::statements::{
    insert_if_absent, strippable, upsert_on_conflict, ServerClock, StatementClock, Statements, STRIPPED,
};
use crate::store_api::{impl_record_pages, impl_store_api};
use crate::store_impl::{bind_claim, impl_idempotency_store};
use crate::table::{COLUMNS, DEFAULT_TABLE};
use crate::transaction::impl_transaction_database;

/// Where the claim statement's result row holds the granted fence and `created_at`,
/// after the columns of the record that stood in the way.
const GRANTED_AT: usize = crate::shape::WRITTEN.len();

/// Idempotency records in PostgreSQL, instants as `TIMESTAMPTZ`.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    parts: Parts<sqlx::Postgres>,
}

impl PostgresStore {
    /// A store on the application's own pool, using the table `idempotent_record`.
    pub fn new(pool: PgPool) -> Self {
        on_table(pool, DEFAULT_TABLE.to_owned())
    }

    /// Connect a pool to `url` (`postgres://user:pass@host/db`): the primary, or a
    /// pooler in front of it. `?pooler=transaction` at the end of the URL says the
    /// address is a pooler in transaction mode ([`Pooler::Transaction`]); without it
    /// statements are prepared and kept ([`Pooler::None`]).
    ///
    /// A server that does not take writes — a hot standby, an HA proxy's replica
    /// port — is refused here, and so is every later
    /// connection of the pool to one: idem writes every claim, and reads records only
    /// where it writes them (a lagging replica would answer a duplicate from an
    /// older state).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let (pooler, url) = Pooler::from_url(url)?;
        Self::connect_with(&url, pooler).await
    }

    /// [`connect`](Self::connect) to `url` through `pooler`.
    pub async fn connect_with(url: &str, pooler: Pooler) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(|e| connecting("PostgreSQL", url, e))?;
        // No startup parameter a pooler refuses unless told to ignore it (PgBouncer:
        // `unsupported startup parameter: extra_float_digits`): idem reads no float.
        let options = options.extra_float_digits(None);
        let options = match pooler {
            Pooler::None => options,
            // Nothing kept on a server connection.
            _ => options.statement_cache_capacity(0),
        };
        let check: Check<sqlx::Postgres> = |conn| Box::pin(refuse_read_only(conn));
        let pool = connect_checked(url, "PostgreSQL", options, Some(check)).await?;
        Ok(Self::new(pool).with_pooler(pooler))
    }

    /// Run the statements as `pooler` needs (default [`Pooler::None`]: prepared once
    /// per connection and kept). [`Pooler::Transaction`] for a pool whose address is a
    /// pooler in transaction mode; its connections should not keep statements
    /// (`PgConnectOptions::statement_cache_capacity(0)`), which
    /// [`connect`](Self::connect) sets.
    pub fn with_pooler(self, pooler: Pooler) -> Self {
        behind(self, pooler)
    }

    /// Use the table `name` instead (`table` or `schema.table`).
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

    /// Create the table and its `expires_at` index if they do not exist (under an
    /// advisory lock, so concurrent start-ups do not race), then check its columns.
    /// Writes nothing to the application's `_sqlx_migrations`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_table(self.create_table()).await
    }

    /// The DDL `migrate` runs, for this store's table: the table, then its `expires_at`
    /// index, each statement ending with `;`. What `idem migrate --print` prints, and,
    /// for the default table, `migrations/postgres.sql`: for teams that keep their
    /// schema in migration files.
    pub fn migration_sql(&self) -> String {
        let table = &self.parts.sql.quoted;
        let types = ColumnTypes {
            biz: "VARCHAR(64)",
            key: "VARCHAR(255)",
            status: "VARCHAR(16)",
            fence: "BIGINT",
            fingerprint: "VARCHAR(64)",
            long_text: "TEXT",
            error_message: "TEXT",
            instant: "TIMESTAMPTZ",
            nullable: "",
            watched: Some("BOOLEAN"),
        };
        let index = derived_identifier::<Self>(&self.parts.sql.table, "expires_at");
        let subject = derived_identifier::<Self>(&self.parts.sql.table, "subject");
        create_table(table, &types, false, &[], "") + &partial_indexes(table, &index, &subject)
    }

    /// [`watch`](Dialect::watch)'s work: the listener started, the record marked.
    async fn mark_watched(&self, biz: &str, key: &str) -> Result<Option<Notice>, StoreError> {
        let sql = &self.parts.sql;
        let listening = self
            .parts
            .listening
            .get_or_try_init(|| crate::listen::start(&self.parts.pool, &sql.table))
            .await?;
        let notice = listening.notices.watch(biz, key);
        let table = &sql.quoted;
        let marked = sql
            .query(&format!(
                "UPDATE {table} SET watched = TRUE \
                 WHERE biz_type = $1 AND idempotent_key = $2 AND status = 'PROCESSING'"
            ))
            .persistent(false)
            .bind(biz)
            .bind(key)
            .execute(&self.parts.pool)
            .await
            .map_err(|e| driver_error("watching a record", e))?;
        Ok((marked.rows_affected() == 1).then_some(notice))
    }

    async fn create_table(&self) -> Result<(), StoreError> {
        const CREATING: &str = "creating the idempotency table";
        let failed = |e| driver_error(CREATING, e);
        // A migration under a timeout may be dropped during its `BEGIN`: `Lent` closes
        // the connection then, instead of handing the pool a transaction.
        let mut lent = crate::pooler::Lent::new(self.parts.pool.acquire().await.map_err(failed)?);
        let conn = &mut *lent.conn;
        crate::pooler::within!(false, CREATING, Some(&mut lent.settled), conn => async {
            self.parts
                .sql
                .query("SELECT pg_advisory_xact_lock(hashtext($1))")
                .bind(&self.parts.sql.table)
                .execute(&mut *conn)
                .await
                .map_err(failed)?;
            for statement in statements(&self.migration_sql()) {
                sqlx::raw_sql(statement).execute(&mut *conn).await.map_err(failed)?;
            }
            Ok(())
        })
        .await
    }
}

impl Dialect for PostgresStore {
    type Stamp = DateTime<Utc>;
    type LockWait = String;
    const QUOTE: char = '"';
    const NUMBERED: bool = true;
    const GREATEST: &'static str = "GREATEST";
    const COLUMNS: &'static str = COLUMNS;
    const BIZ_TEXT: &'static str = "biz_type";
    // The statement's start, the same instant however often a statement reads it.
    const SERVER_CLOCK: Option<ServerClock> = Some(ServerClock {
        now: "statement_timestamp()",
        after: "(statement_timestamp() + ? * INTERVAL '1 microsecond')",
        epoch_micros: "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000000)::BIGINT",
    });

    fn claim_statement(table: &str, clock: StatementClock) -> String {
        let upsert = upsert_on_conflict::<Self>(table, clock);
        let stood: Vec<String> = COLUMNS.split(", ").map(|column| format!("stood.{column}")).collect();
        format!(
            "WITH granted AS ({upsert}) \
             SELECT {}, granted.fence, granted.created_at \
             FROM (SELECT 1) AS one \
             LEFT JOIN granted ON TRUE \
             LEFT JOIN {table} AS stood ON granted.fence IS NULL AND stood.biz_type = $1 AND stood.idempotent_key = $2",
            stood.join(", ")
        )
    }

    fn insert_statement(table: &str, clock: StatementClock) -> Option<String> {
        Some(insert_if_absent::<Self>(table, clock))
    }

    /// The record in the insert's way is read in the statement's snapshot, before the
    /// insert: one the snapshot cannot see (another claim committed it since) leaves
    /// the row empty, and the claim reads it as after a plain insert.
    fn insert_and_read_statement(table: &str, clock: StatementClock) -> Option<String> {
        let insert = insert_if_absent::<Self>(table, clock);
        let (values, conflict) = insert
            .split_once(" ON CONFLICT")
            .expect("the insert has a conflict clause");
        let (into, row) = values
            .split_once(" VALUES (")
            .expect("the insert has one row of values");
        let row = row.strip_suffix(')').expect("the row of values ends the insert");
        let now = clock.0.map_or("statement_timestamp()", |server| server.now);
        Some(format!(
            "WITH stood AS (SELECT {COLUMNS} FROM {table} WHERE biz_type = $1 AND idempotent_key = $2), \
             granted AS ({into} SELECT {row} WHERE NOT EXISTS (SELECT FROM stood) ON CONFLICT{conflict}) \
             SELECT stood.*, {now}, granted.fence, granted.created_at \
             FROM (SELECT 1) AS one LEFT JOIN granted ON TRUE LEFT JOIN stood ON TRUE"
        ))
    }

    async fn insert_if_absent(
        conn: &mut PgConnection,
        insert: FirstClaim<'_>,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> Result<Inserted, StoreError> {
        let row = bind_claim!(sql.query(insert.sql), sql.server_clock, claim)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| driver_error("claim", e))?;
        let Some(row) = row else { return Ok(Inserted::Unread) };
        // The plain insert returns the fence and `created_at` alone; the one that reads
        // too returns the record in its way, the instant, and then those.
        if !insert.reads {
            return Ok(granted_lease::<_, DateTime<Utc>>(claim, &row, 0)?.map_or(Inserted::Unread, Inserted::Granted));
        }
        if let Some(lease) = granted_lease::<_, DateTime<Utc>>(claim, &row, GRANTED_AT + 1)? {
            return Ok(Inserted::Granted(lease));
        }
        let stood: Option<String> = row.try_get(0).map_err(|e| driver_error("claim", e))?;
        if stood.is_none() {
            return Ok(Inserted::Unread);
        }
        read_in_insert::<_, DateTime<Utc>>(&row, sql.server_clock)
    }

    /// SKIP LOCKED: a purge never waits behind a claim in flight.
    fn purge_statement(table: &str, clock: StatementClock) -> String {
        let (now, limit) = match &clock.0 {
            Some(clock) => (clock.now, "$1"),
            None => ("$1", "$2"),
        };
        format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
             WHERE expires_at <= {now} AND (status <> 'PROCESSING' OR lease_until <= {now}) \
             LIMIT {limit} FOR UPDATE SKIP LOCKED))"
        )
    }

    /// SKIP LOCKED, as the purge.
    fn strip_statement(table: &str, clock: StatementClock) -> String {
        let (now, limit) = match &clock.0 {
            Some(clock) => (clock.now, "$1"),
            None => ("$1", "$2"),
        };
        format!(
            "UPDATE {table} SET {STRIPPED}, tombstone = 'EXPIRED' WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} \
             WHERE {} LIMIT {limit} FOR UPDATE SKIP LOCKED))",
            strippable(now)
        )
    }

    fn announced(write: String, name: &str) -> String {
        crate::listen::announced(write, name)
    }

    /// Mark the record `watched`, once this store listens: its completion then
    /// notifies. The mark waits behind a write of the record in progress (a holder
    /// completing it, or taking it over in its own transaction) and then finds it as
    /// that write left it; the reader reads on its schedule meanwhile. Not behind a
    /// pooler in transaction mode (its server connections do not keep a `LISTEN`): the
    /// waiters then read on a schedule only.
    ///
    /// The work runs in a task of its own: a reader whose record finished meanwhile
    /// drops its wait, and a statement dropped half sent would leave its connection
    /// unusable (sqlx waits for the answer to what it never sent before the pool gets
    /// the connection back).
    async fn watch(&self, biz: &str, key: &str) -> Result<Option<Notice>, StoreError> {
        if self.pooler() != Pooler::None {
            return Ok(None);
        }
        let (store, biz, key) = (self.clone(), biz.to_owned(), key.to_owned());
        tokio::spawn(async move { store.mark_watched(&biz, &key).await })
            .await
            .map_err(|e| StoreError::new(format!("watching a record: its task failed ({e})")))?
    }

    /// The server takes writes: a store on the application's own pool is refused here
    /// (at its first call) when the pool reached a standby.
    async fn learn_server(&self) -> Result<(), StoreError> {
        let mut conn = self
            .parts
            .pool
            .acquire()
            .await
            .map_err(|e| driver_error("reading the server's settings", e))?;
        refuse_read_only(&mut conn)
            .await
            .map_err(|e| refused("checking that the server takes writes", e))
    }

    const ADDED_COLUMNS: &'static [(&'static str, &'static str)] = &[
        ("steps", "TEXT"),
        ("subject", "VARCHAR(64)"),
        ("replay_until", "TIMESTAMPTZ"),
        ("tombstone", "VARCHAR(16)"),
        ("watched", "BOOLEAN"),
    ];

    /// What the statements need of each column on PostgreSQL.
    const NEEDS: &'static [Need] = &[
        Need::new("biz_type", EXACT_KEY, exact_key),
        Need::new("idempotent_key", EXACT_KEY, exact_key),
        Need::new("status", "VARCHAR(10) or longer, or TEXT", |c| text_of_at_least(c, 10)),
        Need::new("fence", "BIGINT", |c| c.declared == "bigint"),
        Need::new("fingerprint", "VARCHAR(64) or longer, or TEXT", |c| {
            text_of_at_least(c, 64)
        }),
        Need::new("request_body", UNBOUNDED_TEXT, unbounded_text),
        Need::new("response_body", UNBOUNDED_TEXT, unbounded_text),
        Need::new("error_message", UNBOUNDED_TEXT, unbounded_text),
        Need::new("lease_until", TIMESTAMPTZ6, timestamptz6),
        Need::new("created_at", TIMESTAMPTZ6, timestamptz6),
        Need::new("completed_at", TIMESTAMPTZ6, timestamptz6),
        Need::new("expires_at", TIMESTAMPTZ6, timestamptz6),
        Need::new("steps", UNBOUNDED_TEXT, unbounded_text),
        Need::new("subject", "VARCHAR(64) or longer, or TEXT", |c| text_of_at_least(c, 64)),
        Need::new("replay_until", TIMESTAMPTZ6, timestamptz6),
        Need::new("tombstone", "VARCHAR(8) or longer, or TEXT", |c| text_of_at_least(c, 8)),
        Need::new("watched", "BOOLEAN", |c| c.declared == "boolean"),
    ];

    /// The table's columns and unique keys, from `pg_catalog`.
    async fn read_shape(&self) -> Result<(Vec<Column>, Vec<UniqueKey>), StoreError> {
        let failed = |e| driver_error("reading the idempotency table's shape", e);
        let rows = sqlx::query_as(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), co.collname::text, NOT a.attnotnull, \
               a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', COALESCE(co.collisdeterministic, TRUE) \
             FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        )
        .persistent(self.parts.sql.prepared)
        .bind(&self.parts.sql.quoted);
        let rows: Vec<(String, String, Option<String>, bool, bool, bool)> =
            on_pool!(self.parts, "reading the idempotency table's shape", conn => async {
                rows.fetch_all(conn).await.map_err(failed)
            })
            .await?;
        let columns = rows
            .into_iter()
            .map(
                |(name, declared, collation, nullable, has_default, deterministic)| Column {
                    name,
                    declared,
                    collation: collation.map(|c| {
                        if deterministic {
                            c
                        } else {
                            format!("{c} (nondeterministic)")
                        }
                    }),
                    nullable,
                    has_default,
                    auto_increment: false,
                },
            )
            .collect();
        let keys = sqlx::query_as(
            "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) AS k(n) \
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n) \
             FROM pg_index i WHERE i.indrelid = to_regclass($1) AND i.indisunique \
               AND i.indpred IS NULL AND i.indexprs IS NULL",
        )
        .persistent(self.parts.sql.prepared)
        .bind(&self.parts.sql.quoted);
        let keys: Vec<(Vec<String>,)> = on_pool!(self.parts, "reading the idempotency table's shape", conn => async {
            keys.fetch_all(conn).await.map_err(failed)
        })
        .await?;
        let keys = keys
            .into_iter()
            .map(|(columns,)| UniqueKey {
                collations: vec![None; columns.len()],
                columns,
            })
            .collect();
        Ok((columns, keys))
    }

    /// One round trip either way: the claim statement runs in a CTE, and the same
    /// statement returns the record that stood in the way when it refused (as of the
    /// statement's snapshot; a row committed after it is read separately).
    async fn upsert(
        conn: &mut PgConnection,
        upsert: &str,
        _get: &str,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> Result<Upserted, StoreError> {
        let row = bind_claim!(sql.query(upsert), sql.server_clock, claim)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| driver_error("claim", e))?;
        if let Some(lease) = granted_lease::<_, DateTime<Utc>>(claim, &row, GRANTED_AT)? {
            return Ok(Upserted::Granted(lease));
        }
        let stood: Option<String> = row.try_get(0).map_err(|e| driver_error("claim", e))?;
        match stood {
            Some(_) => Ok(Upserted::Refused(Some(record_from_row::<_, DateTime<Utc>>(&row)?))),
            None => Ok(Upserted::Refused(None)),
        }
    }

    /// Bound the claim's wait for another transaction's lock by `lock_timeout`, under a
    /// savepoint: the setting it replaces, to restore.
    async fn lock_wait_begin(conn: &mut PgConnection, wait: Duration) -> Result<String, StoreError> {
        let millis = wait.as_millis().clamp(1, i32::MAX as u128);
        let row = sqlx::Executor::fetch_one(&mut *conn, format!(
            "SAVEPOINT idem_claim; SELECT current_setting('lock_timeout'), set_config('lock_timeout', '{millis}ms', true)"
        ).as_str())
        .await
        .map_err(|e| driver_error("bounding the claim's lock wait", e))?;
        row.try_get(0)
            .map_err(|e| driver_error("bounding the claim's lock wait", e))
    }

    /// Restore `lock_timeout`; release the savepoint, or roll back to it when the claim
    /// failed, so the caller's transaction goes on as it was.
    async fn lock_wait_end(conn: &mut PgConnection, restore: String, claimed: bool) -> Result<(), StoreError> {
        let sql = if claimed {
            format!(
                "RELEASE SAVEPOINT idem_claim; SELECT set_config('lock_timeout', '{}', true)",
                restore.replace('\'', "''")
            )
        } else {
            "ROLLBACK TO SAVEPOINT idem_claim; RELEASE SAVEPOINT idem_claim".to_owned()
        };
        sqlx::Executor::execute(&mut *conn, sql.as_str())
            .await
            .map(drop)
            .map_err(|e| driver_error("ending the claim's savepoint", e))
    }

    /// `lock_not_available`: `lock_timeout` ran out.
    fn is_lock_wait(error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
    }

    fn rows_changed(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }
}

/// Refuse a server that does not take writes: a hot standby (in recovery), or one
/// whose transactions are read-only by default.
async fn refuse_read_only(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    // No values: sent as text in one message, nothing prepared (as behind a pooler).
    let row = sqlx::Executor::fetch_one(
        &mut *conn,
        "SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')",
    )
    .await?;
    let (recovery, read_only): (bool, String) = (row.try_get(0)?, row.try_get(1)?);
    let why = if recovery {
        "a hot standby (pg_is_in_recovery() is true)"
    } else if read_only == "on" {
        "a server whose transactions are read-only (default_transaction_read_only = on)"
    } else {
        return Ok(());
    };
    Err(sqlx::Error::Configuration(
        format!(
            "reached a read-only server, {why}: idem writes every claim and reads records only where it writes \
             them (a replica that lags would answer a duplicate from an older state). Give the store the primary's \
             address: the HA proxy's primary port, or a pooler in front of the primary (sqlx connects to the one \
             host the URL names and ignores `target_session_attrs`)"
        )
        .into(),
    ))
}

impl_idempotency_store!(PostgresStore, sqlx::Postgres);
impl_store_api!(PostgresStore, sqlx::Postgres);
impl_record_pages!(PostgresStore);
impl_transaction_database!(PostgresStore, sqlx::Postgres, "PostgreSQL");

const EXACT_KEY: &str =
    "VARCHAR or TEXT with a deterministic collation (CHAR(n) ignores trailing spaces in comparisons)";
const UNBOUNDED_TEXT: &str = "TEXT (or VARCHAR without a length)";
const TIMESTAMPTZ6: &str = "TIMESTAMPTZ with microseconds (a holder's writes match its lease to the microsecond)";

/// Keys compare byte for byte, trailing spaces included.
fn exact_key(column: &Column) -> bool {
    let text = column.declared == "text" || column.declared.starts_with("character varying");
    text && !column
        .collation
        .as_deref()
        .is_some_and(|c| c.contains("nondeterministic"))
}

fn unbounded_text(column: &Column) -> bool {
    matches!(column.declared.as_str(), "text" | "character varying")
}

fn timestamptz6(column: &Column) -> bool {
    matches!(
        column.declared.as_str(),
        "timestamp with time zone" | "timestamp(6) with time zone"
    )
}

fn text_of_at_least(column: &Column, chars: u64) -> bool {
    unbounded_text(column)
        || (column.declared.starts_with("character") && length(&column.declared).is_some_and(|n| n >= chars))
}
