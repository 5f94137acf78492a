//! The outbox relay: publishes unsent rows with publisher confirms and marks them sent
//! only once the broker confirmed them.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel};
use sqlx::Pool;
use tracing::{info, warn};

use crate::connection::{self, Backoff, Setup};
use crate::dialect::OutboxDatabase;
use crate::outbox::{Outbox, OutboxRow};

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

/// Publishes an [`Outbox`]'s rows to the broker, at least once each, in id order.
///
/// Each round claims up to [`batch`](Self::batch) unsent rows (on PostgreSQL and
/// MySQL/MariaDB with `FOR UPDATE SKIP LOCKED`, in a transaction held through the
/// round), publishes each as a persistent message (`delivery-mode` 2) with `mandatory`
/// set and the row id as its `message-id`, waits for the broker's confirms, and marks
/// sent — in the same transaction — exactly the rows the broker acked and routed. A row
/// the broker refused, returned as unroutable, or never confirmed stays unsent and is
/// published again in a later round (after the idle pause when the round marked
/// nothing, so a row no queue takes is retried, not spun on; rows behind it go on as
/// long as a batch holds more than the rows that keep failing).
///
/// Killed at any point, a relay loses nothing: rows it published but had not marked are
/// published again by the next relay (its locks went with its connection), so a message
/// can arrive twice — which the idempotent [`Consumer`](crate::Consumer) absorbs, keyed by
/// the message id. Relays running at once skip each other's locked rows, so in the
/// normal case none is published twice. The relay reconnects to the broker by itself.
pub struct Relay<DB: OutboxDatabase> {
    pool: Pool<DB>,
    outbox: Outbox<DB>,
    url: String,
    batch: u16,
    idle: Duration,
    keep_sent: Option<Duration>,
    declare: Option<Setup>,
    stats: Arc<Counters>,
}

impl<DB: OutboxDatabase> Clone for Relay<DB> {
    fn clone(&self) -> Self {
        Relay {
            pool: self.pool.clone(),
            outbox: self.outbox.clone(),
            url: self.url.clone(),
            batch: self.batch,
            idle: self.idle,
            keep_sent: self.keep_sent,
            declare: self.declare.clone(),
            stats: self.stats.clone(),
        }
    }
}

impl<DB: OutboxDatabase> std::fmt::Debug for Relay<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox.table())
            .field("url", &idem_runtime::redacted_url(&self.url))
            .field("batch", &self.batch)
            .field("idle", &self.idle)
            .field("keep_sent", &self.keep_sent)
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

/// How often an idle relay looks for sent rows to delete, once none were left (or
/// after half of [`Relay::keep_sent`], when that is sooner).
const PURGE_EVERY: Duration = Duration::from_secs(60);

impl<DB: OutboxDatabase> Relay<DB> {
    /// A relay of `outbox` in the database behind `pool` to the broker at `amqp_url`.
    pub fn new(pool: Pool<DB>, outbox: Outbox<DB>, amqp_url: impl Into<String>) -> Self {
        Relay {
            pool,
            outbox,
            url: amqp_url.into(),
            batch: DEFAULT_BATCH,
            idle: DEFAULT_IDLE,
            keep_sent: Some(DEFAULT_KEEP_SENT),
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
        let who = format!("relay of {}", self.outbox.table());
        let stats = &self.stats;
        connection::sessions(&who, &self.url, &stats.marked, &stats.sessions_lost, || self.session()).await;
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
        let (_connection, channel) = connection::open(&self.url, &name, self.declare.as_ref()).await?;
        channel.confirm_select(ConfirmSelectOptions::default()).await?;
        info!(outbox = %self.outbox.table(), "relaying");
        let mut database_backoff = Backoff::new();
        let mut next_purge = tokio::time::Instant::now();
        loop {
            match self.round(&channel).await {
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
                self.stats.purged.fetch_add(purged, Ordering::Relaxed);
                purged
            }
            Err(error) => {
                warn!(outbox = %self.outbox.table(), %error, "could not delete sent rows; trying again later");
                0
            }
        }
    }

    /// One round on `channel` (in confirm mode): claim a batch, publish it, mark what
    /// the broker confirmed. How many rows it marked sent.
    pub async fn round(&self, channel: &Channel) -> Result<usize, RelayError> {
        let table = self.outbox.table();
        let limit = i64::from(self.batch);
        let confirmed = if DB::LOCKS_ROWS {
            let mut transaction = self.pool.begin().await?;
            let rows = DB::claim(&mut transaction, table, limit).await?;
            let confirmed = self.publish(channel, &rows).await?;
            DB::mark_sent(&mut transaction, table, &confirmed).await?;
            transaction.commit().await?;
            confirmed
        } else {
            let rows = DB::claim(&mut *self.pool.acquire().await?, table, limit).await?;
            let confirmed = self.publish(channel, &rows).await?;
            DB::mark_sent(&mut *self.pool.acquire().await?, table, &confirmed).await?;
            confirmed
        };
        self.stats.marked.fetch_add(confirmed.len() as u64, Ordering::Relaxed);
        Ok(confirmed.len())
    }

    /// Publish `rows` and wait for every confirm; the ids the broker acked and routed.
    async fn publish(&self, channel: &Channel, rows: &[OutboxRow]) -> Result<Vec<i64>, lapin::Error> {
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            let message = &row.message;
            let mut properties = BasicProperties::default()
                .with_message_id(row.id.to_string().into())
                .with_delivery_mode(2);
            if let Some(content_type) = &message.content_type {
                properties = properties.with_content_type(content_type.as_str().into());
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
            self.stats.published.fetch_add(1, Ordering::Relaxed);
            pending.push((row.id, confirm));
        }
        let mut confirmed = Vec::with_capacity(rows.len());
        for (id, confirm) in pending {
            match confirm.await? {
                Confirmation::Ack(None) => confirmed.push(id),
                Confirmation::Ack(Some(returned)) => {
                    self.stats.returned.fetch_add(1, Ordering::Relaxed);
                    warn!(outbox = %self.outbox.table(), id, reply = %returned.reply_text, "no queue took the message; kept unsent");
                }
                Confirmation::Nack(_) | Confirmation::NotRequested => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    warn!(outbox = %self.outbox.table(), id, "the broker did not confirm the message; kept unsent");
                }
            }
        }
        Ok(confirmed)
    }
}

/// The relay's counters.
#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    marked: AtomicU64,
    returned: AtomicU64,
    refused: AtomicU64,
    purged: AtomicU64,
    sessions_lost: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> RelayStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RelayStats {
            published: read(&self.published),
            marked_sent: read(&self.marked),
            returned: read(&self.returned),
            refused: read(&self.refused),
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
    /// Sent rows deleted after [`Relay::keep_sent`].
    pub purged: u64,
    /// Broker sessions that ended and were started again.
    pub sessions_lost: u64,
}
