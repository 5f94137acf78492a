//! The outbox's SQL on each database.

use async_trait::async_trait;

use crate::outbox::{OutboxMessage, OutboxRow};

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

    /// Create the table and its index.
    #[doc(hidden)]
    async fn create(connection: &mut Self::Connection, table: &str) -> Result<(), sqlx::Error>;

    /// Insert one message; its row id.
    #[doc(hidden)]
    async fn insert(
        connection: &mut Self::Connection,
        table: &str,
        message: &OutboxMessage,
    ) -> Result<i64, sqlx::Error>;

    /// The oldest `limit` unsent rows (locked, skipping locked ones, where the database
    /// can).
    #[doc(hidden)]
    async fn claim(connection: &mut Self::Connection, table: &str, limit: i64) -> Result<Vec<OutboxRow>, sqlx::Error>;

    /// Mark rows sent.
    #[doc(hidden)]
    async fn mark_sent(connection: &mut Self::Connection, table: &str, ids: &[i64]) -> Result<(), sqlx::Error>;

    /// (pending, sent) row counts.
    #[doc(hidden)]
    async fn counts(connection: &mut Self::Connection, table: &str) -> Result<(i64, i64), sqlx::Error>;

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
type Selected = (i64, String, String, Option<String>, Vec<u8>);

fn row((id, exchange, routing_key, content_type, payload): Selected) -> OutboxRow {
    OutboxRow {
        id,
        message: OutboxMessage {
            exchange,
            routing_key,
            payload,
            content_type,
        },
    }
}

/// The statements of one dialect; `{t}` stands for the table.
struct Statements {
    /// Taken in the migration's transaction first, where the database needs it to keep
    /// two processes migrating at once from racing (PostgreSQL's `CREATE … IF NOT
    /// EXISTS` does not).
    lock: Option<&'static str>,
    create: &'static [&'static str],
    insert: &'static str,
    claim: &'static str,
    /// `UPDATE … WHERE id IN (`, the ids bound after it.
    mark_sent: &'static str,
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
        age($micros:ident) => $age:expr
    ) => {
        impl sealed::Sealed for $db {}

        #[async_trait]
        impl OutboxDatabase for $db {
            const LOCKS_ROWS: bool = $locks;

            async fn create(connection: &mut Self::Connection, table: &str) -> Result<(), sqlx::Error> {
                let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
                let statements = $statements.lock.iter().chain($statements.create);
                for statement in statements {
                    sqlx::query(&sql(statement, table))
                        .execute(&mut *transaction)
                        .await?;
                }
                transaction.commit().await
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
                    .bind(limit)
                    .fetch_all(&mut *connection)
                    .await?;
                Ok(rows.into_iter().map(row).collect())
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
                update.build().execute(&mut *connection).await?;
                Ok(())
            }

            async fn counts(connection: &mut Self::Connection, table: &str) -> Result<(i64, i64), sqlx::Error> {
                let (pending, sent): (Option<i64>, Option<i64>) = sqlx::query_as(&sql($statements.counts, table))
                    .fetch_one(&mut *connection)
                    .await?;
                Ok((pending.unwrap_or(0), sent.unwrap_or(0)))
            }

            async fn purge_sent(
                connection: &mut Self::Connection,
                table: &str,
                $micros: i64,
                limit: i64,
            ) -> Result<u64, sqlx::Error> {
                let done = sqlx::query(&sql($statements.purge_sent, table))
                    .bind($age)
                    .bind(limit)
                    .execute(&mut *connection)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}

/// Binds an insert's four values in column order.
macro_rules! bind_message {
    ($query:expr, $message:expr) => {
        $query
            .bind(&$message.exchange)
            .bind(&$message.routing_key)
            .bind(&$message.content_type)
            .bind(&$message.payload)
    };
}

#[cfg(feature = "postgres")]
const POSTGRES: Statements = Statements {
    lock: Some("SELECT pg_advisory_xact_lock(hashtext('idem_amqp.{t}'))"),
    create: &[
        "CREATE TABLE IF NOT EXISTS {t} (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
         exchange TEXT NOT NULL, routing_key TEXT NOT NULL, content_type TEXT, payload BYTEA NOT NULL, \
         created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(), sent_at TIMESTAMPTZ)",
        "CREATE INDEX IF NOT EXISTS {t}_unsent ON {t} (id) WHERE sent_at IS NULL",
    ],
    insert: "INSERT INTO {t} (exchange, routing_key, content_type, payload) VALUES ($1, $2, $3, $4) RETURNING id",
    claim: "SELECT id, exchange, routing_key, content_type, payload FROM {t} WHERE sent_at IS NULL \
            ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
    mark_sent: "UPDATE {t} SET sent_at = statement_timestamp() WHERE id IN (",
    counts: "SELECT COUNT(*) FILTER (WHERE sent_at IS NULL), COUNT(*) FILTER (WHERE sent_at IS NOT NULL) FROM {t}",
    purge_sent: "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE sent_at IS NOT NULL \
                 AND sent_at < statement_timestamp() - $1 * INTERVAL '1 microsecond' ORDER BY id LIMIT $2)",
};

#[cfg(feature = "postgres")]
outbox_database!(sqlx::Postgres, POSTGRES, locks_rows = true, insert(connection, sql, message) => {
    bind_message!(sqlx::query_scalar(&sql), message).fetch_one(&mut *connection).await
}, age(micros) => micros);

#[cfg(feature = "mysql")]
const MYSQL: Statements = Statements {
    lock: None,
    create: &[
        "CREATE TABLE IF NOT EXISTS {t} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
         exchange VARCHAR(255) NOT NULL, routing_key VARCHAR(255) NOT NULL, content_type VARCHAR(255) NULL, \
         payload LONGBLOB NOT NULL, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), \
         sent_at TIMESTAMP(6) NULL, INDEX {t}_unsent (sent_at, id)) ENGINE = InnoDB",
    ],
    insert: "INSERT INTO {t} (exchange, routing_key, content_type, payload) VALUES (?, ?, ?, ?)",
    claim: "SELECT id, exchange, routing_key, content_type, payload FROM {t} WHERE sent_at IS NULL \
            ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED",
    mark_sent: "UPDATE {t} SET sent_at = CURRENT_TIMESTAMP(6) WHERE id IN (",
    counts: "SELECT CAST(SUM(sent_at IS NULL) AS SIGNED), CAST(SUM(sent_at IS NOT NULL) AS SIGNED) FROM {t}",
    purge_sent:
        "DELETE FROM {t} WHERE sent_at IS NOT NULL AND sent_at < CURRENT_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY id LIMIT ?",
};

#[cfg(feature = "mysql")]
outbox_database!(sqlx::MySql, MYSQL, locks_rows = true, insert(connection, sql, message) => {
    // MySQL has no RETURNING: the id is the statement's insert id.
    let done = bind_message!(sqlx::query(&sql), message).execute(&mut *connection).await?;
    i64::try_from(done.last_insert_id()).map_err(|error| sqlx::Error::Decode(Box::new(error)))
}, age(micros) => micros);

#[cfg(feature = "sqlite")]
const SQLITE: Statements = Statements {
    lock: None,
    create: &[
        "CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY AUTOINCREMENT, exchange TEXT NOT NULL, \
         routing_key TEXT NOT NULL, content_type TEXT, payload BLOB NOT NULL, \
         created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), sent_at TEXT)",
        "CREATE INDEX IF NOT EXISTS {t}_unsent ON {t} (id) WHERE sent_at IS NULL",
    ],
    insert: "INSERT INTO {t} (exchange, routing_key, content_type, payload) VALUES (?, ?, ?, ?) RETURNING id",
    claim: "SELECT id, exchange, routing_key, content_type, payload FROM {t} WHERE sent_at IS NULL ORDER BY id LIMIT ?",
    mark_sent: "UPDATE {t} SET sent_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id IN (",
    counts: "SELECT SUM(sent_at IS NULL), SUM(sent_at IS NOT NULL) FROM {t}",
    purge_sent: "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE sent_at IS NOT NULL \
                 AND sent_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?) ORDER BY id LIMIT ?)",
};

#[cfg(feature = "sqlite")]
outbox_database!(sqlx::Sqlite, SQLITE, locks_rows = false, insert(connection, sql, message) => {
    bind_message!(sqlx::query_scalar(&sql), message).fetch_one(&mut *connection).await
}, age(micros) => format!("-{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000));
