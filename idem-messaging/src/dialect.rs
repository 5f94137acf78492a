//! The outbox's SQL on each database.

use async_trait::async_trait;

use crate::outbox::{DeadRow, OutboxMessage, OutboxRow};

mod sealed {
    pub trait Sealed {}
}

/// A database the outbox and its relay run on: PostgreSQL (`sqlx::Postgres`),
/// MySQL/MariaDB (`sqlx::MySql`) or SQLite (`sqlx::Sqlite`), by feature.
///
/// On PostgreSQL and MySQL/MariaDB a relay claims its batch with
/// `FOR UPDATE SKIP LOCKED` in a transaction held until the broker confirmed it, so
/// relays running at once share the rows without publishing one twice, and a relay that
/// dies leaves its rows to the others. SQLite has no row locks: run one relay per file
/// (a second one would publish rows twice, which the consumers absorb).
#[async_trait]
pub trait OutboxDatabase: sqlx::Database + sealed::Sealed {
    /// Whether a batch is claimed with row locks (in a transaction) rather than read.
    #[doc(hidden)]
    const LOCKS_ROWS: bool;

    /// Create the table and its index, in the transaction `connection` is in.
    #[doc(hidden)]
    async fn create(connection: &mut Self::Connection, table: &str) -> Result<(), sqlx::Error>;

    /// Insert one message; its row id.
    #[doc(hidden)]
    async fn insert(
        connection: &mut Self::Connection,
        table: &str,
        message: &OutboxMessage,
    ) -> Result<i64, sqlx::Error>;

    /// The transaction a relay claims its batch in (where rows are locked): on
    /// MySQL/MariaDB at `READ COMMITTED`, so that the claim locks the rows it takes and
    /// no gap after them — at InnoDB's default `REPEATABLE READ` it would hold every
    /// business transaction's outbox insert until the broker confirmed the batch.
    #[doc(hidden)]
    async fn begin_claim(pool: &sqlx::Pool<Self>) -> Result<sqlx::Transaction<'static, Self>, sqlx::Error>;

    /// The oldest `limit` unsent rows (locked, skipping locked ones, where the database
    /// can).
    #[doc(hidden)]
    async fn claim(connection: &mut Self::Connection, table: &str, limit: i64) -> Result<Vec<OutboxRow>, sqlx::Error>;

    /// Mark rows sent.
    #[doc(hidden)]
    async fn mark_sent(connection: &mut Self::Connection, table: &str, ids: &[i64]) -> Result<(), sqlx::Error>;

    /// Record a failed attempt of row `id`: its count, why, and either the instant of the
    /// next try (`retry_in_micros` from now) or, when `dead`, that it is parked.
    #[doc(hidden)]
    async fn fail(connection: &mut Self::Connection, table: &str, failure: &Failure<'_>) -> Result<(), sqlx::Error>;

    /// Parked rows, the oldest first, at most `limit`.
    #[doc(hidden)]
    async fn dead(connection: &mut Self::Connection, table: &str, limit: i64) -> Result<Vec<DeadRow>, sqlx::Error>;

    /// Unpark row `id`, or every parked row when `None`: how many.
    #[doc(hidden)]
    async fn revive(connection: &mut Self::Connection, table: &str, id: Option<i64>) -> Result<u64, sqlx::Error>;

    /// (pending, sent, retrying, dead) row counts.
    #[doc(hidden)]
    async fn counts(connection: &mut Self::Connection, table: &str) -> Result<[i64; 4], sqlx::Error>;

    /// Delete at most `limit` rows sent more than `older_than_micros` ago (by the
    /// database's clock), the oldest first; how many.
    #[doc(hidden)]
    async fn purge_sent(
        connection: &mut Self::Connection,
        table: &str,
        older_than_micros: i64,
        limit: i64,
    ) -> Result<u64, sqlx::Error>;
}

/// A row as the claim selects it.
type Selected = (i64, String, String, Option<String>, Vec<u8>, Option<String>, i32);

fn row(
    (id, exchange, routing_key, content_type, payload, headers, attempts): Selected,
) -> Result<OutboxRow, sqlx::Error> {
    let headers = match headers {
        None => Default::default(),
        Some(json) => serde_json::from_str(&json).map_err(|error| sqlx::Error::Decode(Box::new(error)))?,
    };
    Ok(OutboxRow {
        id,
        attempts: u32::try_from(attempts).unwrap_or(0),
        message: OutboxMessage {
            exchange,
            routing_key,
            payload,
            content_type,
            headers,
        },
    })
}

/// One failed attempt to publish a row, as [`OutboxDatabase::fail`] records it.
#[doc(hidden)]
#[derive(Debug)]
pub struct Failure<'a> {
    pub id: i64,
    /// Attempts so far, this one included.
    pub attempts: u32,
    pub error: &'a str,
    /// When to try again, from now; `None` parks the row.
    pub retry_in_micros: Option<i64>,
}

/// The statements of one dialect; `{t}` stands for the table.
struct Statements {
    /// What begins a relay's claim transaction, when `BEGIN` does not do (it sets that
    /// transaction's isolation first).
    before_claim: Option<&'static str>,
    /// Taken in the migration's transaction first, where the database needs it to keep
    /// two processes migrating at once from racing (PostgreSQL's `CREATE … IF NOT
    /// EXISTS` does not).
    lock: Option<&'static str>,
    create: &'static [&'static str],
    insert: &'static str,
    claim: &'static str,
    /// `UPDATE … WHERE id IN (`, the ids bound after it.
    mark_sent: &'static str,
    /// Binds the attempts, the error, the delay (as `later`), whether parked, the id.
    fail: &'static str,
    /// Binds the limit.
    dead: &'static str,
    /// Binds the id; `{only}` is `AND id = ?` or nothing.
    revive: &'static str,
    counts: &'static str,
    /// Binds how long ago in microseconds (SQLite: a `strftime` modifier), then the limit.
    purge_sent: &'static str,
}

fn sql(template: &str, table: &str) -> String {
    template.replace("{t}", table)
}

/// `OutboxDatabase` for one sqlx database, from its statements and how it returns an
/// inserted row's id.
macro_rules! outbox_database {
    (
        $db:ty, $statements:expr, locks_rows = $locks:expr,
        insert($conn:ident, $sql:ident, $message:ident) => $insert:block,
        age($micros:ident) => $age:expr,
        later($later:ident) => $after:expr,
        one($id:literal)
    ) => {
        impl sealed::Sealed for $db {}

        #[async_trait]
        impl OutboxDatabase for $db {
            const LOCKS_ROWS: bool = $locks;

            async fn begin_claim(pool: &sqlx::Pool<Self>) -> Result<sqlx::Transaction<'static, Self>, sqlx::Error> {
                crate::begin::begin(pool, $statements.before_claim).await
            }

            async fn create(connection: &mut Self::Connection, table: &str) -> Result<(), sqlx::Error> {
                let statements = $statements.lock.iter().chain($statements.create);
                for statement in statements {
                    sqlx::query(&sql(statement, table))
                        .persistent(false)
                        .execute(&mut *connection)
                        .await?;
                }
                Ok(())
            }

            async fn insert(
                $conn: &mut Self::Connection,
                table: &str,
                $message: &OutboxMessage,
            ) -> Result<i64, sqlx::Error> {
                let $sql = sql($statements.insert, table);
                $insert
            }

            async fn claim(
                connection: &mut Self::Connection,
                table: &str,
                limit: i64,
            ) -> Result<Vec<OutboxRow>, sqlx::Error> {
                let rows: Vec<Selected> = sqlx::query_as(&sql($statements.claim, table))
                    .persistent(false)
                    .bind(limit)
                    .fetch_all(&mut *connection)
                    .await?;
                rows.into_iter().map(row).collect()
            }

            async fn fail(
                connection: &mut Self::Connection,
                table: &str,
                failure: &Failure<'_>,
            ) -> Result<(), sqlx::Error> {
                let $later = failure.retry_in_micros.unwrap_or(0);
                sqlx::query(&sql($statements.fail, table))
                    .persistent(false)
                    .bind(i32::try_from(failure.attempts).unwrap_or(i32::MAX))
                    .bind(failure.error)
                    .bind($after)
                    .bind(failure.retry_in_micros.is_none())
                    .bind(failure.id)
                    .execute(&mut *connection)
                    .await?;
                Ok(())
            }

            async fn dead(
                connection: &mut Self::Connection,
                table: &str,
                limit: i64,
            ) -> Result<Vec<DeadRow>, sqlx::Error> {
                let rows: Vec<(i64, String, String, i32, Option<String>)> =
                    sqlx::query_as(&sql($statements.dead, table))
                        .persistent(false)
                        .bind(limit)
                        .fetch_all(&mut *connection)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map(|(id, exchange, routing_key, attempts, error)| DeadRow {
                        id,
                        exchange,
                        routing_key,
                        attempts: u32::try_from(attempts).unwrap_or(0),
                        error: error.unwrap_or_default(),
                    })
                    .collect())
            }

            async fn revive(
                connection: &mut Self::Connection,
                table: &str,
                id: Option<i64>,
            ) -> Result<u64, sqlx::Error> {
                let only = if id.is_some() {
                    concat!(" AND id = ", $id)
                } else {
                    ""
                };
                let statement = sql($statements.revive, table).replace("{only}", only);
                let mut query = sqlx::query(&statement).persistent(false);
                if let Some(id) = id {
                    query = query.bind(id);
                }
                Ok(query.execute(&mut *connection).await?.rows_affected())
            }

            async fn mark_sent(connection: &mut Self::Connection, table: &str, ids: &[i64]) -> Result<(), sqlx::Error> {
                if ids.is_empty() {
                    return Ok(());
                }
                let mut update = sqlx::QueryBuilder::<$db>::new(sql($statements.mark_sent, table));
                let mut list = update.separated(", ");
                for id in ids {
                    list.push_bind(*id);
                }
                update.push(")");
                update.build().persistent(false).execute(&mut *connection).await?;
                Ok(())
            }

            async fn counts(connection: &mut Self::Connection, table: &str) -> Result<[i64; 4], sqlx::Error> {
                type Counts = (Option<i64>, Option<i64>, Option<i64>, Option<i64>);
                let (pending, sent, retrying, dead): Counts = sqlx::query_as(&sql($statements.counts, table))
                    .persistent(false)
                    .fetch_one(&mut *connection)
                    .await?;
                Ok([pending, sent, retrying, dead].map(|count| count.unwrap_or(0)))
            }

            async fn purge_sent(
                connection: &mut Self::Connection,
                table: &str,
                $micros: i64,
                limit: i64,
            ) -> Result<u64, sqlx::Error> {
                let done = sqlx::query(&sql($statements.purge_sent, table))
                    .persistent(false)
                    .bind($age)
                    .bind(limit)
                    .execute(&mut *connection)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}

/// Binds an insert's five values in column order.
macro_rules! bind_message {
    ($query:expr, $message:expr) => {
        $query
            .bind(&$message.exchange)
            .bind(&$message.routing_key)
            .bind(&$message.content_type)
            .bind(&$message.payload)
            .bind(headers_json(&$message.headers))
    };
}

/// The headers as the `headers` column keeps them: a JSON object, or NULL for none.
fn headers_json(headers: &std::collections::BTreeMap<String, String>) -> Option<String> {
    (!headers.is_empty()).then(|| serde_json::to_string(headers).expect("a map of strings is JSON"))
}

#[cfg(feature = "postgres")]
const POSTGRES: Statements = Statements {
    before_claim: None,
    lock: Some("SELECT pg_advisory_xact_lock(hashtext('idem_amqp.{t}'))"),
    create: &[
        "CREATE TABLE IF NOT EXISTS {t} (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         exchange TEXT NOT NULL, routing_key TEXT NOT NULL, content_type TEXT, payload BYTEA NOT NULL, \
         headers TEXT, created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(), sent_at TIMESTAMPTZ, \
         attempts INT NOT NULL DEFAULT 0, next_attempt_at TIMESTAMPTZ, dead_at TIMESTAMPTZ, last_error TEXT)",
        "CREATE INDEX IF NOT EXISTS {t}_unsent ON {t} (id) WHERE sent_at IS NULL",
    ],
    insert: "INSERT INTO {t} (exchange, routing_key, content_type, payload, headers) VALUES ($1, $2, $3, $4, $5) RETURNING id",
    claim: "SELECT id, exchange, routing_key, content_type, payload, headers, attempts FROM {t} WHERE sent_at IS NULL \
            AND dead_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= statement_timestamp()) \
            ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    mark_sent: "UPDATE {t} SET sent_at = statement_timestamp() WHERE id IN (",
    fail: "UPDATE {t} SET attempts = $1, last_error = $2, \
           next_attempt_at = statement_timestamp() + $3 * INTERVAL '1 microsecond', \
           dead_at = CASE WHEN $4 THEN statement_timestamp() END WHERE id = $5",
    dead: "SELECT id, exchange, routing_key, attempts, last_error FROM {t} WHERE dead_at IS NOT NULL ORDER BY id LIMIT $1",
    revive: "UPDATE {t} SET dead_at = NULL, next_attempt_at = NULL, attempts = 0, last_error = NULL \
             WHERE dead_at IS NOT NULL AND sent_at IS NULL{only}",
    counts: "SELECT COUNT(*) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL), \
             COUNT(*) FILTER (WHERE sent_at IS NOT NULL), \
             COUNT(*) FILTER (WHERE sent_at IS NULL AND dead_at IS NULL AND attempts > 0), \
             COUNT(*) FILTER (WHERE dead_at IS NOT NULL AND sent_at IS NULL) FROM {t}",
    purge_sent: "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE sent_at IS NOT NULL \
                 AND sent_at < statement_timestamp() - $1 * INTERVAL '1 microsecond' ORDER BY id LIMIT $2)",
};

#[cfg(feature = "postgres")]
outbox_database!(sqlx::Postgres, POSTGRES, locks_rows = true, insert(connection, sql, message) => {
    bind_message!(sqlx::query_scalar(&sql).persistent(false), message).fetch_one(&mut *connection).await
}, age(micros) => micros, later(micros) => micros, one("$1"));

#[cfg(feature = "mysql")]
const MYSQL: Statements = Statements {
    before_claim: Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION"),
    lock: None,
    create: &[
        "CREATE TABLE IF NOT EXISTS {t} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         exchange VARCHAR(255) NOT NULL, routing_key VARCHAR(255) NOT NULL, content_type VARCHAR(255) NULL, \
         payload LONGBLOB NOT NULL, headers TEXT NULL, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         sent_at TIMESTAMP(6) NULL, attempts INT NOT NULL DEFAULT 0, next_attempt_at TIMESTAMP(6) NULL, \
         dead_at TIMESTAMP(6) NULL, last_error TEXT NULL, INDEX {t}_unsent (sent_at, id)) ENGINE = InnoDB",
    ],
    insert: "INSERT INTO {t} (exchange, routing_key, content_type, payload, headers) VALUES (?, ?, ?, ?, ?)",
    claim: "SELECT id, exchange, routing_key, content_type, payload, headers, attempts FROM {t} WHERE sent_at IS NULL \
            AND dead_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= CURRENT_TIMESTAMP(6)) \
            ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
    mark_sent: "UPDATE {t} SET sent_at = CURRENT_TIMESTAMP(6) WHERE id IN (",
    fail:
        "UPDATE {t} SET attempts = ?, last_error = ?, next_attempt_at = CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND, \
           dead_at = IF(?, CURRENT_TIMESTAMP(6), NULL) WHERE id = ?",
    dead:
        "SELECT id, exchange, routing_key, attempts, last_error FROM {t} WHERE dead_at IS NOT NULL ORDER BY id LIMIT ?",
    revive: "UPDATE {t} SET dead_at = NULL, next_attempt_at = NULL, attempts = 0, last_error = NULL \
             WHERE dead_at IS NOT NULL AND sent_at IS NULL{only}",
    counts:
        "SELECT CAST(SUM(sent_at IS NULL AND dead_at IS NULL) AS SIGNED), CAST(SUM(sent_at IS NOT NULL) AS SIGNED), \
             CAST(SUM(sent_at IS NULL AND dead_at IS NULL AND attempts > 0) AS SIGNED), \
             CAST(SUM(dead_at IS NOT NULL AND sent_at IS NULL) AS SIGNED) FROM {t}",
    purge_sent:
        "DELETE FROM {t} WHERE sent_at IS NOT NULL AND sent_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY id LIMIT ?",
};

#[cfg(feature = "mysql")]
outbox_database!(sqlx::MySql, MYSQL, locks_rows = true, insert(connection, sql, message) => {
    // MySQL has no RETURNING: the id is the statement's insert id.
    let done = bind_message!(sqlx::query(&sql).persistent(false), message).execute(&mut *connection).await?;
    i64::try_from(done.last_insert_id()).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}, age(micros) => micros, later(micros) => micros, one("?"));

#[cfg(feature = "sqlite")]
const SQLITE: Statements = Statements {
    before_claim: None,
    lock: None,
    create: &[
        "CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, exchange TEXT NOT NULL, \
         routing_key TEXT NOT NULL, content_type TEXT, payload BLOB NOT NULL, headers TEXT, \
         created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), sent_at TEXT, \
         attempts INTEGER NOT NULL DEFAULT 0, next_attempt_at TEXT, dead_at TEXT, last_error TEXT)",
        "CREATE INDEX IF NOT EXISTS {t}_unsent ON {t} (id) WHERE sent_at IS NULL",
    ],
    insert: "INSERT INTO {t} (exchange, routing_key, content_type, payload, headers) VALUES (?, ?, ?, ?, ?) RETURNING id",
    claim: "SELECT id, exchange, routing_key, content_type, payload, headers, attempts FROM {t} WHERE sent_at IS NULL \
            AND dead_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= strftime('%Y-%m-%dT%H:%M:%fZ', 'now')) \
            ORDER BY id LIMIT ?",
    mark_sent: "UPDATE {t} SET sent_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id IN (",
    fail: "UPDATE {t} SET attempts = ?, last_error = ?, next_attempt_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?), \
           dead_at = CASE WHEN ? THEN strftime('%Y-%m-%dT%H:%M:%fZ', 'now') END WHERE id = ?",
    dead: "SELECT id, exchange, routing_key, attempts, last_error FROM {t} WHERE dead_at IS NOT NULL ORDER BY id LIMIT ?",
    revive: "UPDATE {t} SET dead_at = NULL, next_attempt_at = NULL, attempts = 0, last_error = NULL \
             WHERE dead_at IS NOT NULL AND sent_at IS NULL{only}",
    counts: "SELECT SUM(sent_at IS NULL AND dead_at IS NULL), SUM(sent_at IS NOT NULL), \
             SUM(sent_at IS NULL AND dead_at IS NULL AND attempts > 0), SUM(dead_at IS NOT NULL AND sent_at IS NULL) FROM {t}",
    purge_sent: "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE sent_at IS NOT NULL \
                 AND sent_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) ORDER BY id LIMIT ?)",
};

#[cfg(feature = "sqlite")]
outbox_database!(sqlx::Sqlite, SQLITE, locks_rows = false, insert(connection, sql, message) => {
    bind_message!(sqlx::query_scalar(&sql).persistent(false), message).fetch_one(&mut *connection).await
}, age(micros) => format!("-{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000),
   later(micros) => format!("+{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000), one("?"));
