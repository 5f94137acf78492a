//! The store on SQLite (3.35 or later: the claim needs `RETURNING`).

use std::str::FromStr;
use std::time::Duration;

use idem_runtime::{Claim, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool, SqlitePoolOptions};

use crate::dialect::{derived_identifier, on_table, renamed, Dialect, Parts, Upserted};
use crate::error::driver_error;
use crate::migration::{create_table, partial_indexes, statements, ColumnTypes};
use crate::row::granted_lease;
use crate::shape::{Column, Need, UniqueKey};
use crate::statements::{strippable, upsert_on_conflict, ServerClock, StatementClock, Statements, STRIPPED};
use crate::store_api::{impl_record_pages, impl_store_api};
use crate::store_impl::{bind_claim, impl_idempotency_store};
use crate::table::{COLUMNS, DEFAULT_TABLE};
use crate::transaction::impl_transaction_database;
use idem_runtime::redacted_url as redacted;

/// The oldest SQLite with `RETURNING` on an upsert.
const MIN_VERSION: (u32, u32) = (3, 35);

/// Idempotency records in a SQLite database file.
///
/// Instants are stored as fixed-width UTC text (`2026-11-29 16:00:00.123456`), which
/// sorts as time and reads as it is in the `sqlite3` shell.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    parts: Parts<sqlx::Sqlite>,
}

impl SqliteStore {
    /// A store on the application's own pool, using the table `idempotent_record`.
    pub fn new(pool: SqlitePool) -> Self {
        on_table(pool, DEFAULT_TABLE.to_owned())
    }

    /// Open (creating if missing) the database at `url` (`sqlite://path/to/file.db`)
    /// with a 10 s busy timeout, so several processes can share it. [`migrate`]
    /// switches the file to WAL journaling.
    ///
    /// [`migrate`]: Self::migrate
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let shown = redacted(url);
        if !url.starts_with("sqlite:") {
            return Err(StoreError::new(format!(
                "SqliteStore cannot connect to `{shown}`: give it a `sqlite://path` URL (idem::sql::open picks the \
                 store by the URL's scheme)"
            )));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| driver_error(&format!("parsing the SQLite URL `{shown}`"), e))?
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
        // A connection to a file does not die while it waits in the pool: lent without
        // sqlx's ping (a trip to the connection's thread before every statement).
        let pool = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(|e| driver_error(&format!("opening the SQLite file of `{shown}`"), e))?;
        Ok(Self::new(pool))
    }

    /// Use the table `name` instead (letters, digits and `_`; a reserved word is
    /// fine). An attached database's `schema.table` is refused: SQLite names the
    /// schema on the index, not the table, and idem keeps one table in the main file.
    pub fn with_table_name(self, name: &str) -> Result<Self, StoreError> {
        if name.contains('.') {
            return Err(StoreError::new(format!(
                "invalid table name {name:?} for SQLite: use a table of the main database, without `schema.`"
            )));
        }
        renamed(self, name)
    }

    /// Switch the file to WAL journaling (readers never block the claim), create the
    /// table and its `expires_at` index if they do not exist, then check that the table
    /// has every column idem needs. Refuses SQLite older than 3.35. Writes nothing to
    /// the application's `_sqlx_migrations`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(&self.parts.pool)
            .await
            .map_err(|e| driver_error("reading the SQLite version", e))?;
        require_returning(&version)?;
        self.use_wal().await?;
        self.migrate_table(self.create_table()).await
    }

    /// The DDL `migrate` runs, for this store's table: the table, then its `expires_at`
    /// index, each statement ending with `;`. What `idem migrate --print` prints, and,
    /// for the default table, `migrations/sqlite.sql`: for teams that keep their schema
    /// in migration files.
    pub fn migration_sql(&self) -> String {
        let table = &self.parts.sql.quoted;
        let types = ColumnTypes {
            biz: TEXT,
            key: TEXT,
            status: TEXT,
            fence: "INTEGER",
            fingerprint: TEXT,
            long_text: TEXT,
            error_message: TEXT,
            instant: TEXT,
            nullable: "",
            watched: None,
        };
        let index = derived_identifier::<Self>(&self.parts.sql.table, "expires_at");
        let subject = derived_identifier::<Self>(&self.parts.sql.table, "subject");
        create_table(table, &types, true, &[], "") + &partial_indexes(table, &index, &subject)
    }

    async fn create_table(&self) -> Result<(), StoreError> {
        for statement in statements(&self.migration_sql()) {
            sqlx::query(statement)
                .execute(&self.parts.pool)
                .await
                .map_err(|e| driver_error("creating the idempotency table", e))?;
        }
        Ok(())
    }

    /// The switch to WAL takes the file's exclusive lock, which SQLite's busy timeout
    /// does not wait for; processes starting together retry it a few times.
    async fn use_wal(&self) -> Result<(), StoreError> {
        let mut attempt = 0;
        loop {
            match sqlx::query("PRAGMA journal_mode = WAL").execute(&self.parts.pool).await {
                Ok(_) => return Ok(()),
                Err(error) if attempt < 50 && is_busy(&error) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt)).await;
                }
                Err(error) => return Err(driver_error("switching to WAL journaling", error)),
            }
        }
    }
}

impl Dialect for SqliteStore {
    type Stamp = String;
    type LockWait = i64;
    const QUOTE: char = '"';
    const NUMBERED: bool = false;
    const GREATEST: &'static str = "MAX";
    const COLUMNS: &'static str = COLUMNS;
    const BIZ_TEXT: &'static str = "biz_type";
    const SERVER_CLOCK: Option<ServerClock> = None;

    fn claim_statement(table: &str, clock: StatementClock) -> String {
        upsert_on_conflict::<Self>(table, clock)
    }

    /// SQLite lives on its host's clock: the caller's `now` is bound.
    fn purge_statement(table: &str, _clock: StatementClock) -> String {
        format!(
            "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} \
             WHERE expires_at <= ?1 AND (status <> 'PROCESSING' OR lease_until <= ?1) LIMIT ?2)"
        )
    }

    fn strip_statement(table: &str, _clock: StatementClock) -> String {
        format!(
            "UPDATE {table} SET {STRIPPED}, tombstone = 'EXPIRED' WHERE rowid IN (SELECT rowid FROM {table} \
             WHERE {} LIMIT ?2)",
            strippable("?1")
        )
    }

    const ADDED_COLUMNS: &'static [(&'static str, &'static str)] = &[
        ("steps", "TEXT"),
        ("subject", "TEXT"),
        ("replay_until", "TEXT"),
        ("tombstone", "TEXT"),
    ];

    /// What the statements need of each column on SQLite.
    const NEEDS: &'static [Need] = &[
        Need::new("biz_type", TEXT, text_affinity),
        Need::new("idempotent_key", TEXT, text_affinity),
        Need::new("status", TEXT, text_affinity),
        Need::new("fence", "INTEGER", |c| c.declared.to_ascii_uppercase().contains("INT")),
        Need::new("fingerprint", TEXT, text_affinity),
        Need::new("request_body", TEXT, text_affinity),
        Need::new("response_body", TEXT, text_affinity),
        Need::new("error_message", TEXT, text_affinity),
        Need::new("lease_until", INSTANT, instant),
        Need::new("created_at", INSTANT, instant),
        Need::new("completed_at", INSTANT, instant),
        Need::new("expires_at", INSTANT, instant),
        Need::new("steps", TEXT, text_affinity),
        Need::new("subject", TEXT, text_affinity),
        Need::new("replay_until", INSTANT, instant),
        Need::new("tombstone", TEXT, text_affinity),
    ];

    /// The table's columns and unique keys (with the collation each key column is
    /// compared with), from SQLite's table-valued pragmas.
    async fn read_shape(&self) -> Result<(Vec<Column>, Vec<UniqueKey>), StoreError> {
        // Always a table of the main database: `with_table_name` refuses `schema.table`.
        let (schema, name) = ("main", self.parts.sql.table.as_str());
        let failed = |e| driver_error("reading the idempotency table's shape", e);
        let rows: Vec<(String, String, bool, bool)> = sqlx::query_as(
            "SELECT name, type, \"notnull\", dflt_value IS NOT NULL FROM pragma_table_info(?1, ?2) ORDER BY cid",
        )
        .bind(name)
        .bind(schema)
        .fetch_all(&self.parts.pool)
        .await
        .map_err(failed)?;
        let columns = rows
            .into_iter()
            .map(|(name, declared, not_null, has_default)| Column {
                name,
                declared,
                collation: None,
                nullable: !not_null,
                has_default,
                auto_increment: false,
            })
            .collect();
        let indexes: Vec<(String,)> =
            sqlx::query_as("SELECT name FROM pragma_index_list(?1, ?2) WHERE \"unique\" = 1 AND partial = 0")
                .bind(name)
                .bind(schema)
                .fetch_all(&self.parts.pool)
                .await
                .map_err(failed)?;
        let mut keys = Vec::new();
        for (index,) in indexes {
            let parts: Vec<(Option<String>, Option<String>)> =
                sqlx::query_as("SELECT name, coll FROM pragma_index_xinfo(?1, ?2) WHERE key = 1 ORDER BY seqno")
                    .bind(&index)
                    .bind(schema)
                    .fetch_all(&self.parts.pool)
                    .await
                    .map_err(failed)?;
            keys.push(UniqueKey {
                columns: parts
                    .iter()
                    .map(|(column, _)| column.clone().unwrap_or_default())
                    .collect(),
                collations: parts.into_iter().map(|(_, collation)| collation).collect(),
            });
        }
        Ok((columns, keys))
    }

    /// One statement decides; it returns a row when it granted. (Reading first would
    /// spare replays the write lock, but costs every first execution a trip to sqlx's
    /// connection thread: measured 1.27× the floor against 1.06×.)
    async fn upsert(
        conn: &mut SqliteConnection,
        upsert: &str,
        _get: &str,
        sql: &Statements,
        claim: &Claim<'_>,
    ) -> Result<Upserted, StoreError> {
        let granted = bind_claim!(sql.query(upsert), sql.server_clock, claim)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| driver_error("claim", e))?;
        let lease = match granted {
            Some(row) => granted_lease::<_, String>(claim, &row, 0)?,
            None => None,
        };
        Ok(lease.map_or(Upserted::Refused(None), Upserted::Granted))
    }

    /// Bound the claim's wait for another writer by the connection's `busy_timeout`:
    /// the timeout it replaces, to restore.
    async fn lock_wait_begin(conn: &mut SqliteConnection, wait: Duration) -> Result<i64, StoreError> {
        let failed = |e| driver_error("bounding the claim's lock wait", e);
        let old: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(&mut *conn)
            .await
            .map_err(failed)?;
        let millis = wait.as_millis().clamp(1, i32::MAX as u128);
        sqlx::Executor::execute(&mut *conn, format!("PRAGMA busy_timeout = {millis}").as_str())
            .await
            .map_err(failed)?;
        Ok(old)
    }

    /// Restore the connection's `busy_timeout`.
    async fn lock_wait_end(conn: &mut SqliteConnection, restore: i64, _claimed: bool) -> Result<(), StoreError> {
        sqlx::Executor::execute(&mut *conn, format!("PRAGMA busy_timeout = {restore}").as_str())
            .await
            .map(drop)
            .map_err(|e| driver_error("restoring busy_timeout", e))
    }

    /// Another connection held the write lock past the wait.
    fn is_lock_wait(error: &sqlx::Error) -> bool {
        is_busy(error)
    }

    fn rows_changed(done: &<Self::Db as sqlx::Database>::QueryResult) -> u64 {
        done.rows_affected()
    }
}

impl_idempotency_store!(SqliteStore, sqlx::Sqlite);
impl_store_api!(SqliteStore, sqlx::Sqlite);
impl_record_pages!(SqliteStore);
impl_transaction_database!(SqliteStore, sqlx::Sqlite, "SQLite");

const TEXT: &str = "TEXT";
const INSTANT: &str = "TEXT, DATETIME or TIMESTAMP (instants are stored as fixed-width UTC text)";

/// SQLite's affinity rules: a declared type containing `INT` is an integer; one with
/// `CHAR`, `CLOB` or `TEXT`, text.
fn text_affinity(column: &Column) -> bool {
    let declared = column.declared.to_ascii_uppercase();
    !declared.contains("INT") && ["CHAR", "CLOB", "TEXT"].iter().any(|t| declared.contains(t))
}

/// Text, or a date type whose numeric affinity keeps the stored text as it is.
fn instant(column: &Column) -> bool {
    let declared = column.declared.to_ascii_uppercase();
    text_affinity(column) || declared == "DATETIME" || declared == "TIMESTAMP"
}

/// SQLITE_BUSY (5) and SQLITE_LOCKED (6), extended codes included (`SQLITE_BUSY_SNAPSHOT`
/// is 517: the primary code is the low byte).
fn is_busy(error: &sqlx::Error) -> bool {
    let code = match error {
        sqlx::Error::Database(db) => db.code().and_then(|code| code.parse::<u32>().ok()),
        _ => None,
    };
    matches!(code.map(|code| code & 0xff), Some(5 | 6))
}

/// Refuse a SQLite without `RETURNING` on upserts, naming the version found.
fn require_returning(version: &str) -> Result<(), StoreError> {
    let mut parts = version.split('.').map(|part| part.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found >= MIN_VERSION {
        Ok(())
    } else {
        Err(StoreError::new(format!(
            "SQLite {version} is too old for idem: the claim is one `INSERT … ON CONFLICT … RETURNING` \
             statement, which needs SQLite {}.{} or later",
            MIN_VERSION.0, MIN_VERSION.1
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::require_returning;

    #[test]
    fn extended_busy_codes_are_busy() {
        use super::is_busy;
        use sqlx::error::{DatabaseError, ErrorKind};

        #[derive(Debug)]
        struct Coded(&'static str);
        impl std::fmt::Display for Coded {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "code {}", self.0)
            }
        }
        impl std::error::Error for Coded {}
        impl DatabaseError for Coded {
            fn message(&self) -> &str {
                "coded"
            }
            fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
                Some(self.0.into())
            }
            fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
                self
            }
            fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
                self
            }
            fn kind(&self) -> ErrorKind {
                ErrorKind::Other
            }
        }
        let busy = |code| is_busy(&sqlx::Error::Database(Box::new(Coded(code))));
        for code in ["5", "6", "261", "517", "773", "262"] {
            assert!(busy(code), "{code}");
        }
        for code in ["1", "19", "2067"] {
            assert!(!busy(code), "{code}");
        }
    }

    #[test]
    fn refuses_sqlite_without_returning() {
        assert!(require_returning("3.35.0").is_ok());
        assert!(require_returning("3.46.1").is_ok());
        let error = require_returning("3.34.1").unwrap_err().to_string();
        assert!(
            error.contains("SQLite 3.34.1 is too old") && error.contains("3.35"),
            "{error}"
        );
    }

    /// A release parks only a record that holds steps. Its delete found no record
    /// without steps under the lease; a record without steps that stands under the same
    /// fence and life by the time the park runs (another claim's new life, begun at the
    /// same instant in between) keeps its lease.
    #[tokio::test]
    async fn the_park_of_a_release_leaves_a_record_without_steps_alone() {
        use idem_runtime::{Claim, ClaimOutcome, FenceCheck, IdempotencyStore};
        use std::time::{Duration, SystemTime};

        let path = idem_testkit::scratch::path("park.db");
        let _ = std::fs::remove_file(&path);
        let store = super::SqliteStore::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let claim = Claim::new(
            "b",
            "k",
            SystemTime::now(),
            Duration::from_secs(30),
            Duration::from_secs(60),
        );
        let ClaimOutcome::Acquired(lease) = store.claim(&claim).await.unwrap() else {
            panic!("a first claim is acquired")
        };
        let lease_until = store.get("b", "k").await.unwrap().unwrap().lease_until;
        let mut conn = store.parts.pool.acquire().await.unwrap();
        let park = sqlx::query(&store.parts.sql.park);
        let parked = super::SqliteStore::write_held(&mut *conn, "release", park, &lease)
            .await
            .unwrap();
        assert_eq!(parked, FenceCheck::Lost, "the park touched a record without steps");
        let record = store.get("b", "k").await.unwrap().unwrap();
        assert_eq!(record.lease_until, lease_until, "the holder's lease still runs");
        drop(conn);
        let _ = std::fs::remove_file(&path);
    }
}
