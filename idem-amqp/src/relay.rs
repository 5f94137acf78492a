//! The outbox relay: publishes unsent rows with publisher confirms and marks them sent
//! only once the broker confirmed them.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::{HashMap, HashSet};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};
use sqlx::Pool;
use tracing::{error, info, warn};

use crate::connection::{self, Broker, Setup};
use idem_messaging::Backoff;
use idem_messaging::{Failure, Outbox, OutboxDatabase, OutboxRow};

/// Why a relay's round failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The database failed: nothing was marked sent; the rows are published again.
    #[error("outbox database: {0}")]
    Database(#[from] sqlx::Error),
    /// The broker failed: nothing unconfirmed was marked sent.
    #[error("broker: {0}")]
    Broker(#[from] lapin::Error),
}

/// Publishes an [`Outbox`]'s rows to the broker, at least once each.
///
/// Each round claims up to [`batch`](Self::batch) unsent rows, the lowest ids first (on
/// PostgreSQL and MySQL/MariaDB with `FOR UPDATE SKIP LOCKED`, in a transaction held
/// through the round), publishes each as a persistent message (`delivery-mode` 2) with
/// `mandatory` set, the row id as its `message-id` and the row's headers, waits for the
/// broker's confirms, and marks sent — in the same transaction — exactly the rows the
/// broker acked and routed.
///
/// A row that fails — returned as unroutable (no queue bound), refused (`nack`), or
/// addressed to an exchange that does not exist (checked before publishing, on a
/// channel of its own, so the relay's channel is not closed by it) — is not published
/// again at once: its attempt is counted with the reason, and it waits
/// [`retry_after`](Self::retry_after), doubling with each failure up to five minutes,
/// while the rows behind it go on. After [`max_attempts`](Self::max_attempts) failures
/// it is parked: left unsent, never published again, counted in
/// [`OutboxCounts::dead`](crate::OutboxCounts::dead) and listed by [`Outbox::dead`],
/// until [`Outbox::retry_dead`] (or `idem outbox retry-dead`) gives it back. So messages
/// leave in id order except around a row that failed, which goes later; a consumer that
/// needs an order must not rely on the outbox for it.
///
/// lapin logs each message the broker returns at `WARN`, payload included (target
/// `lapin::returned_messages`); where payloads are confidential, filter that target
/// (`lapin::returned_messages=error`). The relay's own log line names the row, never
/// its payload.
///
/// Killed at any point, a relay loses nothing: rows it published but had not marked are
/// published again by the next relay (its locks went with its connection), so a message
/// can arrive twice — which the idempotent [`Consumer`](crate::Consumer) absorbs, keyed by
/// the message id. Relays running at once skip each other's locked rows, so in the
/// normal case none is published twice. The relay reconnects to the broker by itself.
pub struct Relay<DB: OutboxDatabase> {
    pool: Pool<DB>,
    outbox: Outbox<DB>,
    broker: Broker,
    batch: u16,
    idle: Duration,
    keep_sent: Option<Duration>,
    max_attempts: u32,
    retry_after: Duration,
    declare: Option<Setup>,
    stats: Arc<Counters>,
}

impl<DB: OutboxDatabase> Clone for Relay<DB> {
    fn clone(&self) -> Self {
        Relay {
            pool: self.pool.clone(),
            outbox: self.outbox.clone(),
            broker: self.broker.clone(),
            batch: self.batch,
            idle: self.idle,
            keep_sent: self.keep_sent,
            max_attempts: self.max_attempts,
            retry_after: self.retry_after,
            declare: self.declare.clone(),
            stats: self.stats.clone(),
        }
    }
}

impl<DB: OutboxDatabase> std::fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox.table())
            .field("url", &idem_runtime::redacted_url(&self.broker.url))
            .field("batch", &self.batch)
            .field("idle", &self.idle)
            .field("keep_sent", &self.keep_sent)
            .field("max_attempts", &self.max_attempts)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

/// Rows a relay publishes in one round, by default.
pub const DEFAULT_BATCH: u16 = 100;

/// How long a relay waits after a round that found nothing, by default.
pub const DEFAULT_IDLE: Duration = Duration::from_millis(100);

/// How long a relay keeps rows the broker confirmed before it deletes them, by default:
/// 7 days.
pub const DEFAULT_KEEP_SENT: Duration = Duration::from_secs(7 * 24 * 3600);

/// How many failed attempts park a row, by default.
pub const DEFAULT_RELAY_ATTEMPTS: u32 = 10;

/// The pause after a row's first failed attempt, by default (doubling with each
/// failure, up to [`LONGEST_RETRY`]).
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest pause between two attempts of a failing row.
pub const LONGEST_RETRY: Duration = Duration::from_secs(300);

/// How often an idle relay looks for sent rows to delete, once none were left (or
/// after half of [`Relay::keep_sent`], when that is sooner).
const PURGE_EVERY: Duration = Duration::from_secs(60);

impl<DB: OutboxDatabase> Relay<DB> {
    /// A relay of `outbox` in the database behind `pool` to the broker at `amqp_url`.
    pub fn new(pool: Pool<DB>, outbox: Outbox<DB>, amqp_url: impl Into<String>) -> Self {
        Relay {
            pool,
            outbox,
            broker: Broker::new(amqp_url.into()),
            batch: DEFAULT_BATCH,
            idle: DEFAULT_IDLE,
            keep_sent: Some(DEFAULT_KEEP_SENT),
            max_attempts: DEFAULT_RELAY_ATTEMPTS,
            retry_after: DEFAULT_RETRY_AFTER,
            declare: None,
            stats: Arc::default(),
        }
    }

    /// Rows per round (default 100; at least 1).
    pub fn batch(mut self, rows: u16) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// The pause after a round that found no row (default 100 ms).
    pub fn idle(mut self, pause: Duration) -> Self {
        self.idle = pause;
        self
    }

    /// How long rows the broker confirmed are kept before the relay deletes them
    /// ([`Outbox::purge_sent`]: a batch of [`batch`](Self::batch) rows at a time, in
    /// rounds that found nothing to publish, until none is left, then again a minute —
    /// or half the time kept — later); `None` keeps them for ever. Default
    /// [`DEFAULT_KEEP_SENT`].
    pub fn keep_sent(mut self, keep: Option<Duration>) -> Self {
        self.keep_sent = keep;
        self
    }

    /// How many failed attempts park a row (default [`DEFAULT_RELAY_ATTEMPTS`]; at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The pause before a failed row is tried again, doubling with each failure up to
    /// [`LONGEST_RETRY`] (default [`DEFAULT_RETRY_AFTER`]).
    pub fn retry_after(mut self, pause: Duration) -> Self {
        self.retry_after = pause.min(LONGEST_RETRY);
        self
    }

    /// The properties of each connection this relay opens (lapin's: client properties,
    /// an authentication provider, the locale); idem adds only the connection's name.
    /// Default: lapin's defaults.
    pub fn connection_properties(mut self, properties: lapin::ConnectionProperties) -> Self {
        self.broker.properties = properties;
        self
    }

    /// Declare exchanges, queues and bindings on each new channel, before publishing.
    pub fn on_connect<F, Fut>(mut self, declare: F) -> Self
    where
        F: Fn(Channel) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), lapin::Error>> + Send + 'static,
    {
        self.declare = Some(connection::setup(declare));
        self
    }

    /// What this relay (and its clones) did so far.
    pub fn stats(&self) -> RelayStats {
        self.stats.snapshot()
    }

    /// Relay until the process ends, reconnecting when the broker goes away and pausing
    /// when the database fails.
    pub async fn run(&self) {
        let role = connection::Role {
            kind: "relay",
            name: self.outbox.table(),
        };
        let stats = &self.stats;
        connection::sessions(role, &self.broker.url, &stats.marked, &stats.sessions_lost, || {
            self.session()
        })
        .await;
    }

    /// [`run`](Self::run) until `stop` completes. A round cut off by it marks nothing;
    /// its rows are published again.
    pub async fn run_until(&self, stop: impl Future<Output = ()>) {
        tokio::select! {
            () = stop => {}
            () = self.run() => {}
        }
    }

    /// Rounds on one broker connection, until the broker fails.
    async fn session(&self) -> Result<(), lapin::Error> {
        let name = format!("idem relay of {}", self.outbox.table());
        let (connection, channel) = connection::open(&self.broker, &name, self.declare.as_ref()).await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        info!(outbox = %self.outbox.table(), "relaying");
        let mut database_backoff = Backoff::new();
        let mut next_purge = tokio::time::Instant::now();
        let mut exchanges = Exchanges::new(&connection);
        loop {
            match self.round_with(&channel, &mut exchanges).await {
                // Nothing found, or nothing the broker took (an unroutable row at the
                // head): wait before the next round rather than spin.
                Ok(0) => {
                    if tokio::time::Instant::now() >= next_purge {
                        // Another batch at the next idle round while a whole one went.
                        if self.purge_sent().await < u64::from(self.batch) {
                            let keep = self.keep_sent.unwrap_or(PURGE_EVERY);
                            next_purge = tokio::time::Instant::now() + PURGE_EVERY.min(keep / 2);
                        }
                    }
                    tokio::time::sleep(self.idle).await;
                }
                Ok(_) => database_backoff.reset(),
                Err(RelayError::Broker(error)) => return Err(error),
                Err(error) => {
                    warn!(outbox = %self.outbox.table(), %error, "relay round failed; trying again");
                    database_backoff.pause().await;
                }
            }
        }
    }

    /// One batch of rows sent longer than [`keep_sent`](Self::keep_sent) ago deleted,
    /// when the relay keeps them for a while: how many. A failure is only logged (a later
    /// idle round tries again).
    async fn purge_sent(&self) -> u64 {
        let Some(keep) = self.keep_sent else { return 0 };
        match self.outbox.purge_sent(&self.pool, keep, u64::from(self.batch)).await {
            Ok(purged) => {
                self.stats
                    .count(&self.stats.purged, self.outbox.table(), "purged", purged);
                purged
            }
            Err(error) => {
                warn!(outbox = %self.outbox.table(), %error, "could not delete sent rows; trying again later");
                0
            }
        }
    }

    /// One round on `channel` (in confirm mode): claim a batch, publish it, mark what
    /// the broker confirmed, count the failures. How many rows it marked sent.
    ///
    /// Exchanges are not checked first here (the relay's own rounds check each once per
    /// session): a row for an exchange that does not exist closes `channel`.
    pub async fn round(&self, channel: &Channel) -> Result<usize, RelayError> {
        self.round_with(channel, &mut Exchanges::unchecked()).await
    }

    async fn round_with(&self, channel: &Channel, exchanges: &mut Exchanges<'_>) -> Result<usize, RelayError> {
        let table = self.outbox.table();
        let limit = i64::from(self.batch);
        let confirmed = if DB::LOCKS_ROWS {
            let mut transaction = DB::begin_claim(&self.pool).await?;
            let rows = DB::claim(&mut transaction, table, limit).await?;
            let published = self.publish(channel, exchanges, &rows).await?;
            DB::mark_sent(&mut transaction, table, &published.confirmed).await?;
            self.record_failures(&mut transaction, &published.failed).await?;
            transaction.commit().await?;
            published.confirmed
        } else {
            let rows = DB::claim(&mut *self.pool.acquire().await?, table, limit).await?;
            let published = self.publish(channel, exchanges, &rows).await?;
            let mut connection = self.pool.acquire().await?;
            DB::mark_sent(&mut connection, table, &published.confirmed).await?;
            self.record_failures(&mut connection, &published.failed).await?;
            published.confirmed
        };
        self.stats
            .count(&self.stats.marked, table, "sent", confirmed.len() as u64);
        Ok(confirmed.len())
    }

    /// Count each failed row's attempt; set its next one, or park it.
    async fn record_failures(&self, connection: &mut DB::Connection, failed: &[Failed<'_>]) -> Result<(), sqlx::Error> {
        let table = self.outbox.table();
        for Failed { row, error } in failed {
            let (id, attempts) = (row.id, row.attempts + 1);
            let retry_in = (attempts < self.max_attempts).then(|| self.pause_after(attempts));
            let failure = Failure {
                id,
                attempts,
                error,
                retry_in_micros: retry_in.map(|pause| i64::try_from(pause.as_micros()).unwrap_or(i64::MAX)),
            };
            DB::fail(connection, table, &failure).await?;
            match retry_in {
                Some(pause) => {
                    self.stats.count(&self.stats.failed, table, "retried_later", 1);
                    warn!(outbox = %table, id, attempts, retry_in = ?pause, %error, "could not publish the row; trying it again later");
                }
                None => {
                    self.stats.count(&self.stats.parked, table, "parked", 1);
                    error!(outbox = %table, id, attempts, %error,
                        "could not publish the row; parked (fix the cause, then `idem outbox retry-dead`)");
                }
            }
        }
        Ok(())
    }

    /// The pause after a row's `attempts`-th failure.
    fn pause_after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(20);
        self.retry_after.saturating_mul(1 << doublings).min(LONGEST_RETRY)
    }

    /// Publish `rows` and wait for every confirm: the ids the broker acked and routed,
    /// and the ids that failed, with why.
    async fn publish<'r>(
        &self,
        channel: &Channel,
        exchanges: &mut Exchanges<'_>,
        rows: &'r [OutboxRow],
    ) -> Result<Published<'r>, lapin::Error> {
        let mut published = Published::default();
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            let message = &row.message;
            if let Some(missing) = exchanges.missing(&message.exchange).await? {
                published.failed.push(Failed { row, error: missing });
                continue;
            }
            let mut properties = BasicProperties::default()
                .with_message_id(row.id.to_string().into())
                .with_delivery_mode(2);
            if let Some(content_type) = &message.content_type {
                properties = properties.with_content_type(content_type.as_str().into());
            }
            if !message.headers.is_empty() {
                let mut headers = FieldTable::default();
                for (name, value) in &message.headers {
                    headers.insert(name.as_str().into(), AMQPValue::LongString(value.as_str().into()));
                }
                properties = properties.with_headers(headers);
            }
            let mandatory = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let confirm = channel
                .basic_publish(
                    message.exchange.as_str().into(),
                    message.routing_key.as_str().into(),
                    mandatory,
                    &message.payload,
                    properties,
                )
                .await?;
            self.stats
                .count(&self.stats.published, self.outbox.table(), "published", 1);
            pending.push((row, confirm));
        }
        // A return comes before its message's ack, but the client hands it to whichever
        // confirm the next ack resolves first (an ack of several messages resolves them
        // in no set order): the return says which row it was by the message id the
        // relay gave it, and only that row failed.
        let mut acked = Vec::with_capacity(pending.len());
        let mut returned = HashMap::new();
        for (row, confirm) in pending {
            match confirm.await? {
                Confirmation::Ack(None) => acked.push(row),
                Confirmation::Ack(Some(message)) => {
                    self.stats
                        .count(&self.stats.returned, self.outbox.table(), "returned", 1);
                    let id = message
                        .delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .and_then(|id| id.as_str().parse::<i64>().ok())
                        .unwrap_or(row.id);
                    returned.insert(id, format!("no queue took the message: {}", message.reply_text));
                    acked.push(row);
                }
                Confirmation::Nack(_) | Confirmation::NotRequested => {
                    self.stats.count(&self.stats.refused, self.outbox.table(), "refused", 1);
                    let error = "the broker refused the message (nack)".to_owned();
                    published.failed.push(Failed { row, error });
                }
            }
        }
        for row in acked {
            match returned.remove(&row.id) {
                Some(error) => published.failed.push(Failed { row, error }),
                None => published.confirmed.push(row.id),
            }
        }
        Ok(published)
    }
}

/// What one batch's publishing came to.
#[derive(Debug, Default)]
struct Published<'r> {
    confirmed: Vec<i64>,
    failed: Vec<Failed<'r>>,
}

/// A row whose attempt failed, and why.
#[derive(Debug)]
struct Failed<'r> {
    row: &'r OutboxRow,
    error: String,
}

/// The exchanges a session has found to exist. Each other one is looked up once, with
/// a passive declare on a channel of its own: publishing to a missing exchange would
/// close the relay's channel and end the session, again and again.
struct Exchanges<'c> {
    connection: Option<&'c Connection>,
    known: HashSet<String>,
}

impl<'c> Exchanges<'c> {
    fn new(connection: &'c Connection) -> Self {
        Exchanges {
            connection: Some(connection),
            known: HashSet::new(),
        }
    }

    /// No lookups: every exchange taken to exist.
    fn unchecked() -> Self {
        Exchanges {
            connection: None,
            known: HashSet::new(),
        }
    }

    /// Why `exchange` cannot be published to (it does not exist), or `None`. The
    /// default exchange (`""`) always exists.
    async fn missing(&mut self, exchange: &str) -> Result<Option<String>, lapin::Error> {
        let Some(connection) = self.connection else {
            return Ok(None);
        };
        if exchange.is_empty() || self.known.contains(exchange) {
            return Ok(None);
        }
        let probe = connection.create_channel().await?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = probe
            .exchange_declare(exchange.into(), ExchangeKind::Direct, passive, FieldTable::default())
            .await;
        match declared {
            Ok(()) => {
                let _ = probe.close(200, "exchange found".into()).await;
                self.known.insert(exchange.to_owned());
                Ok(None)
            }
            // The broker closes the probe's channel with 404 NOT_FOUND.
            Err(error) if not_found(&error) => Ok(Some(format!("exchange {exchange:?} does not exist"))),
            Err(error) => Err(error),
        }
    }
}

/// Whether the broker answered 404 NOT_FOUND.
fn not_found(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

/// The relay's counters.
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    marked: AtomicU64,
    returned: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    parked: AtomicU64,
    purged: AtomicU64,
    sessions_lost: AtomicU64,
}

impl Counters {
    /// `n` more of `counter`, also counted as `outcome` of `outbox` in the metrics.
    fn count(&self, counter: &AtomicU64, outbox: &str, outcome: &'static str, n: u64) {
        // The metric first: whoever reads the figure then finds the metric counted too.
        crate::observe::relay_rows(outbox, outcome, n);
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> RelayStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RelayStats {
            published: read(&self.published),
            marked_sent: read(&self.marked),
            returned: read(&self.returned),
            refused: read(&self.refused),
            retried_later: read(&self.failed),
            parked: read(&self.parked),
            purged: read(&self.purged),
            sessions_lost: read(&self.sessions_lost),
        }
    }
}

/// What a [`Relay`] did since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Messages published (a row published again counts again).
    pub published: u64,
    /// Rows marked sent after the broker confirmed them.
    pub marked_sent: u64,
    /// Messages the broker returned as unroutable (kept unsent).
    pub returned: u64,
    /// Messages the broker refused to confirm (kept unsent).
    pub refused: u64,
    /// Failed attempts after which the row waits to be tried again (returned, refused,
    /// or to an exchange that does not exist).
    pub retried_later: u64,
    /// Rows parked after [`Relay::max_attempts`] failures.
    pub parked: u64,
    /// Sent rows deleted after [`Relay::keep_sent`].
    pub purged: u64,
    /// Broker sessions that ended and were started again.
    pub sessions_lost: u64,
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_row_waits_longer_after_each_failure() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let relay = Relay::new(pool, Outbox::new(), "amqp://127.0.0.1").retry_after(Duration::from_millis(500));
        let pauses: Vec<u64> = [1, 2, 3, 4, 10, 40]
            .map(|n| relay.pause_after(n).as_millis() as u64)
            .to_vec();
        assert_eq!(pauses, [500, 1000, 2000, 4000, 256_000, 300_000]);
        let default = Relay::new(relay.pool.clone(), Outbox::new(), "amqp://127.0.0.1");
        assert_eq!(default.pause_after(1), DEFAULT_RETRY_AFTER);
    }
}
