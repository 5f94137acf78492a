//! The outbox table: messages written in the business transaction, published later by
//! the relay.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::Serialize;
use sqlx::{Database, Pool};

use crate::begin::begin;
use crate::dialect::OutboxDatabase;

/// The outbox table's default name.
pub const DEFAULT_TABLE: &str = "idem_outbox";

/// A message to publish: where to, its bytes, and its headers.
///
/// ```
/// use idem_messaging::OutboxMessage;
///
/// let message = OutboxMessage::json("", "orders", &serde_json::json!({ "order": 7 }))?
///     .with_header("correlation-id", "req-81f3")
///     .with_header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// assert_eq!(message.headers["correlation-id"], "req-81f3");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The exchange (`""` is the default exchange, which routes by queue name).
    pub exchange: String,
    /// The routing key (the queue's name on the default exchange).
    pub routing_key: String,
    /// The body, published as is.
    pub payload: Vec<u8>,
    /// The `content-type` property (`application/json` for [`json`](Self::json)).
    pub content_type: Option<String>,
    /// Headers published with the message as AMQP string headers (a correlation id,
    /// trace context such as `traceparent`); kept as a JSON object in the row.
    pub headers: BTreeMap<String, String>,
}

impl OutboxMessage {
    /// `payload` as is, to `routing_key` on `exchange`, with no content type or header.
    pub fn bytes(exchange: impl Into<String>, routing_key: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        OutboxMessage {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            payload: payload.into(),
            content_type: None,
            headers: BTreeMap::new(),
        }
    }

    /// `body` as JSON, to `routing_key` on `exchange`.
    pub fn json<T: Serialize + ?Sized>(
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        body: &T,
    ) -> Result<Self, serde_json::Error> {
        let mut message = Self::bytes(exchange, routing_key, serde_json::to_vec(body)?);
        message.content_type = Some("application/json".to_owned());
        Ok(message)
    }

    /// The message with header `name` set to `value` (replacing an earlier value).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }
}

/// A row read back for publishing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[doc(hidden)]
pub struct OutboxRow {
    pub id: i64,
    /// Failed attempts so far.
    pub attempts: u32,
    pub message: OutboxMessage,
}

/// A row the relay parked after the relay's `max_attempts`
/// failed attempts: it is not published again until [`Outbox::retry_dead`] says so.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadRow {
    /// The row id (the message id it is published with).
    pub id: i64,
    /// Its exchange.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
    /// How many times it failed.
    pub attempts: u32,
    /// Why it failed the last time (`no queue took the message: NO_ROUTE`, `exchange
    /// "orders" does not exist`, …).
    pub error: String,
}

/// The table name was not a plain SQL identifier.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "invalid outbox table name {0:?}: use letters, digits and `_` (not starting with a digit), at most 64 characters"
)]
pub struct InvalidTableName(String);

/// An outbox table on database `DB` (PostgreSQL, MySQL/MariaDB or SQLite).
///
/// [`push`](Self::push) writes a message in the caller's transaction — the one an
/// `#[idempotent(tx = tx)]` function commits with its record and its business rows — so
/// the message exists exactly when the business change does. Each row's id is never
/// reused (an identity column, `AUTO_INCREMENT`, SQLite's `AUTOINCREMENT`), which makes
/// it fit to be the message id that consumers are keyed by — within one outbox. Ids of
/// two outboxes (two tables, two databases, or a table dropped and made again) overlap:
/// give each its own queue, or key its consumers by something of the message itself
/// (the consumer's key source).
#[derive(Debug)]
pub struct Outbox<DB> {
    table: Arc<str>,
    database: PhantomData<fn() -> DB>,
}

impl<DB> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            table: self.table.clone(),
            database: PhantomData,
        }
    }
}

impl<DB: OutboxDatabase> Default for Outbox<DB> {
    fn default() -> Self {
        Outbox {
            table: Arc::from(DEFAULT_TABLE),
            database: PhantomData,
        }
    }
}

impl<DB: OutboxDatabase> Outbox<DB> {
    /// The outbox in table [`DEFAULT_TABLE`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The outbox in table `name`.
    pub fn named(name: &str) -> Result<Self, InvalidTableName> {
        let plain = name.len() <= 64
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && name.chars().next().is_some_and(|c| !c.is_ascii_digit());
        if !plain {
            return Err(InvalidTableName(name.to_owned()));
        }
        Ok(Outbox {
            table: Arc::from(name),
            database: PhantomData,
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Create the table and its index of unsent rows if they do not exist.
    pub async fn migrate(&self, pool: &Pool<DB>) -> Result<(), sqlx::Error> {
        let mut transaction = begin(pool, None).await?;
        DB::create(&mut transaction, &self.table).await?;
        transaction.commit().await
    }

    /// Write `message` through `connection` — a transaction's (`&mut *tx`) — and return
    /// its row id, which will be its message id.
    pub async fn push(
        &self,
        connection: &mut <DB as Database>::Connection,
        message: &OutboxMessage,
    ) -> Result<i64, sqlx::Error> {
        DB::insert(connection, &self.table, message).await
    }

    /// Delete rows the broker confirmed more than `older_than` ago (by the database's
    /// clock), at most `limit` in one statement, the oldest first: how many went. Call
    /// it again until it answers less than `limit`; unsent rows are never touched. A
    /// a relay does this by itself (its `keep_sent`).
    ///
    /// Ids are not reused once their rows are gone (an identity column, `AUTOINCREMENT`,
    /// and InnoDB's counter, which MariaDB 10.2.4+ and MySQL 8 keep across restarts), so
    /// consumers keyed by the message id never see an old id again.
    pub async fn purge_sent(
        &self,
        pool: &Pool<DB>,
        older_than: std::time::Duration,
        limit: u64,
    ) -> Result<u64, sqlx::Error> {
        let micros = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        // Each of these statements in a transaction of its own: one server connection
        // for the whole statement behind a pooler in transaction mode.
        let mut transaction = begin(pool, None).await?;
        let purged = DB::purge_sent(&mut transaction, &self.table, micros, limit).await?;
        transaction.commit().await.map(|()| purged)
    }

    /// How many rows wait to be published, were published, are parked.
    pub async fn counts(&self, pool: &Pool<DB>) -> Result<OutboxCounts, sqlx::Error> {
        let mut transaction = begin(pool, None).await?;
        let [pending, sent, retrying, dead] = DB::counts(&mut transaction, &self.table).await?;
        transaction.commit().await?;
        Ok(OutboxCounts {
            pending,
            sent,
            retrying,
            dead,
        })
    }

    /// The rows the relay parked, the oldest first, at most `limit`.
    pub async fn dead(&self, pool: &Pool<DB>, limit: u64) -> Result<Vec<DeadRow>, sqlx::Error> {
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let mut transaction = begin(pool, None).await?;
        let dead = DB::dead(&mut transaction, &self.table, limit).await?;
        transaction.commit().await.map(|()| dead)
    }

    /// Give parked rows back to the relay with a fresh count of attempts: the row `id`,
    /// or every parked row when `None`. How many. Fix what made them fail first (declare
    /// the exchange, bind a queue): they are published at the relay's next round.
    pub async fn retry_dead(&self, pool: &Pool<DB>, id: Option<i64>) -> Result<u64, sqlx::Error> {
        let mut transaction = begin(pool, None).await?;
        let revived = DB::revive(&mut transaction, &self.table, id).await?;
        transaction.commit().await.map(|()| revived)
    }
}

/// The rows of an outbox by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxCounts {
    /// Rows not yet confirmed by the broker, and not parked (those that failed before
    /// and wait for their next attempt included).
    pub pending: i64,
    /// Rows the broker confirmed.
    pub sent: i64,
    /// Of the pending rows, those that failed at least once and wait for their next
    /// attempt.
    pub retrying: i64,
    /// Rows parked after too many failed attempts ([`Outbox::dead`]).
    pub dead: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(
            Outbox::<sqlx::Sqlite>::named("orders_outbox").unwrap().table(),
            "orders_outbox"
        );
        for bad in ["", "1outbox", "out box", "x; DROP TABLE y", &"t".repeat(65)] {
            let error = Outbox::<sqlx::Sqlite>::named(bad).unwrap_err();
            assert!(error.to_string().contains("letters, digits"), "{error}");
        }
    }
}
