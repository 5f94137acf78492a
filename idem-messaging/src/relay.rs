//! The outbox relay, whatever the broker: rounds that claim unsent rows, hand them to the
//! broker, and mark sent — in the claim's transaction — exactly the rows the broker
//! confirmed. A row that fails waits longer after each failure and is parked after a
//! bound; sent rows are deleted after a while. Each broker brings only its publishing
//! ([`Broker`]): RabbitMQ's with publisher confirms (`idem-amqp`), JetStream's with
//! publish acks and the row id as `Nats-Msg-Id` (`idem-nats`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use tracing::{error, info, warn};

use crate::session::{sessions, Role};
use crate::{Backoff, Failure, Outbox, OutboxDatabase, OutboxRow};

/// A broker the relay publishes to: how to open a session on it, and how to publish a
/// batch of rows on that session and learn which of them the broker took.
///
/// ```
/// use idem_messaging::relay::{Broker, Published, Tally};
/// use idem_messaging::OutboxRow;
///
/// /// A broker that takes every row (a stand-in, as a test would use).
/// struct TakesAll;
///
/// impl Broker for TakesAll {
///     type Session = ();
///     type Error = std::io::Error;
///
///     fn shown_url(&self) -> String {
///         "memory".into()
///     }
///     async fn connect(&self, _name: &str) -> Result<(), std::io::Error> {
///         Ok(())
///     }
///     async fn publish<'r>(&self, _: &mut (), rows: &'r [OutboxRow], tally: &Tally<'_>) -> Result<Published<'r>, std::io::Error> {
///         tally.published(rows.len() as u64);
///         Ok(Published { confirmed: rows.iter().map(|row| row.id).collect(), ..Published::default() })
///     }
/// }
/// ```
pub trait Broker: Send + Sync + 'static {
    /// What one connection publishes on (a channel in confirm mode, a JetStream
    /// context).
    type Session: Send;
    /// Why the broker failed. The session ends with it, nothing unconfirmed is marked
    /// sent, and the relay starts another session.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The broker's address as logs may show it (its credentials hidden).
    fn shown_url(&self) -> String;

    /// A new session, named `name` where the broker lists its connections.
    fn connect(&self, name: &str) -> impl Future<Output = Result<Self::Session, Self::Error>> + Send;

    /// Publish `rows` on `session` and wait until the broker has answered for each: the
    /// ids it confirmed (durably taken, and routed somewhere), and the rows it did not
    /// take, with why. A row in neither list is published again by a later round. Each
    /// message handed to the broker, returned as unroutable or refused is told to
    /// `tally`.
    fn publish<'r>(
        &self,
        session: &mut Self::Session,
        rows: &'r [OutboxRow],
        tally: &Tally<'_>,
    ) -> impl Future<Output = Result<Published<'r>, Self::Error>> + Send;

    /// `n` rows of `outbox` came to `outcome` (`published`, `sent`, `returned`,
    /// `refused`, `retried_later`, `parked`, `purged`): the broker crate's metrics. By
    /// default nothing.
    fn count_rows(outbox: &str, outcome: &'static str, n: u64) {
        let _ = (outbox, outcome, n);
    }

    /// The relay of `outbox` lost its session: the broker crate's metrics. By default
    /// nothing.
    fn count_session_lost(outbox: &str) {
        let _ = outbox;
    }
}

/// What one batch's publishing came to.
#[derive(Debug, Default)]
pub struct Published<'r> {
    /// The ids of the rows the broker confirmed: they are marked sent.
    pub confirmed: Vec<i64>,
    /// The rows the broker did not take, with why: each waits, or is parked.
    pub failed: Vec<Failed<'r>>,
}

/// A row whose attempt failed, and why.
#[derive(Debug)]
pub struct Failed<'r> {
    /// The row.
    pub row: &'r OutboxRow,
    /// Why, as the row's `last_error` keeps it (never the payload).
    pub error: String,
}

/// Where a [`Broker`] counts what it did with a batch, into the relay's
/// [`RelayStats`] and the broker's metrics.
pub struct Tally<'a> {
    counters: &'a RelayCounters,
    outbox: &'a str,
    metrics: fn(&str, &'static str, u64),
}

impl Tally<'_> {
    /// `n` messages handed to the broker.
    pub fn published(&self, n: u64) {
        self.count(&self.counters.published, "published", n);
    }

    /// A message the broker returned: no queue or stream took it.
    pub fn returned(&self) {
        self.count(&self.counters.returned, "returned", 1);
    }

    /// A message the broker refused to confirm.
    pub fn refused(&self) {
        self.count(&self.counters.refused, "refused", 1);
    }

    /// `n` more of `counter`, also counted as `outcome` in the metrics.
    fn count(&self, counter: &AtomicU64, outcome: &'static str, n: u64) {
        // The metric first: whoever reads the figure then finds the metric counted too.
        if n > 0 {
            (self.metrics)(self.outbox, outcome, n);
        }
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// Why a relay's round failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError<E: std::error::Error + 'static> {
    /// The database failed: nothing was marked sent; the rows are published again.
    #[error("outbox database: {0}")]
    Database(#[from] sqlx::Error),
    /// The broker failed: nothing unconfirmed was marked sent.
    #[error("broker: {0}")]
    Broker(#[source] E),
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

/// Publishes an [`Outbox`]'s rows to a [`Broker`], at least once each.
///
/// Each round claims up to [`batch`](Self::batch) unsent rows, the lowest ids first (on
/// PostgreSQL and MySQL/MariaDB with `FOR UPDATE SKIP LOCKED`, in a transaction held
/// through the round), hands them to the broker, waits for its answers, and marks sent —
/// in the same transaction — exactly the rows the broker confirmed.
///
/// A row that fails (the broker's answer says why: unroutable, refused, a destination
/// that does not exist) is not published again at once: its attempt is counted with the
/// reason, and it waits [`retry_after`](Self::retry_after), doubling with each failure
/// up to five minutes, while the rows behind it go on. After
/// [`max_attempts`](Self::max_attempts) failures it is parked: left unsent, never
/// published again, counted in [`OutboxCounts::dead`](crate::OutboxCounts::dead) and
/// listed by [`Outbox::dead`], until [`Outbox::retry_dead`] (or `idem outbox
/// retry-dead`) gives it back. So messages leave in id order except around a row that
/// failed, which goes later; a consumer that needs an order must not rely on the outbox
/// for it.
///
/// Killed at any point, a relay loses nothing: rows it published but had not marked are
/// published again by the next relay (its locks went with its connection), so a message
/// can arrive twice — which an idempotent consumer absorbs, keyed by the row id the
/// message carries. Relays running at once skip each other's locked rows, so in the
/// normal case none is published twice. The relay reconnects to the broker by itself.
pub struct Relay<DB: OutboxDatabase, B: Broker> {
    pool: Pool<DB>,
    outbox: Outbox<DB>,
    broker: Arc<B>,
    batch: u16,
    idle: Duration,
    keep_sent: Option<Duration>,
    max_attempts: u32,
    retry_after: Duration,
    stats: Arc<RelayCounters>,
}

impl<DB: OutboxDatabase, B: Broker> Clone for Relay<DB, B> {
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
            stats: self.stats.clone(),
        }
    }
}

impl<DB: OutboxDatabase, B: Broker> std::fmt::Debug for Relay<DB, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("outbox", &self.outbox.table())
            .field("broker", &self.broker.shown_url())
            .field("batch", &self.batch)
            .field("idle", &self.idle)
            .field("keep_sent", &self.keep_sent)
            .field("max_attempts", &self.max_attempts)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl<DB: OutboxDatabase, B: Broker> Relay<DB, B> {
    /// A relay of `outbox` in the database behind `pool` to `broker` (for the broker
    /// crates' relays, its URL).
    pub fn new(pool: Pool<DB>, outbox: Outbox<DB>, broker: impl Into<B>) -> Self {
        Relay {
            pool,
            outbox,
            broker: Arc::new(broker.into()),
            batch: DEFAULT_BATCH,
            idle: DEFAULT_IDLE,
            keep_sent: Some(DEFAULT_KEEP_SENT),
            max_attempts: DEFAULT_RELAY_ATTEMPTS,
            retry_after: DEFAULT_RETRY_AFTER,
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

    /// The broker this relay publishes to.
    pub fn broker(&self) -> &B {
        &self.broker
    }

    /// What this relay (and its clones) did so far.
    pub fn stats(&self) -> RelayStats {
        self.stats.snapshot()
    }

    /// Relay until the process ends, reconnecting when the broker goes away and pausing
    /// when the database fails.
    pub async fn run(&self) {
        let table = self.outbox.table();
        let shown = self.broker.shown_url();
        let role = Role {
            kind: "relay",
            name: table,
            broker: &shown,
        };
        let stats = &self.stats;
        let on_lost = || B::count_session_lost(table);
        sessions(role, &stats.marked, &stats.sessions_lost, on_lost, || self.session()).await;
    }

    /// [`run`](Self::run) until `stop` completes. A round cut off by it marks nothing;
    /// its rows are published again.
    pub async fn run_until(&self, stop: impl Future<Output = ()>) {
        tokio::select! {
            () = stop => {}
            () = self.run() => {}
        }
    }

    /// A session on the broker, for [`round`](Self::round).
    pub async fn connect(&self) -> Result<B::Session, B::Error> {
        self.broker
            .connect(&format!("idem relay of {}", self.outbox.table()))
            .await
    }

    /// Rounds on one session, until the broker fails.
    async fn session(&self) -> Result<(), B::Error> {
        let mut session = self.connect().await?;
        info!(outbox = %self.outbox.table(), broker = %self.broker.shown_url(), "relaying");
        let mut database_backoff = Backoff::new();
        let mut next_purge = tokio::time::Instant::now();
        loop {
            match self.round(&mut session).await {
                // Nothing found, or nothing the broker took (a failing row at the head):
                // wait before the next round rather than spin.
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
                self.tally().count(&self.stats.purged, "purged", purged);
                purged
            }
            Err(error) => {
                warn!(outbox = %self.outbox.table(), %error, "could not delete sent rows; trying again later");
                0
            }
        }
    }

    /// Where this relay's counts go.
    fn tally(&self) -> Tally<'_> {
        Tally {
            counters: &self.stats,
            outbox: self.outbox.table(),
            metrics: B::count_rows,
        }
    }

    /// One round on `session`: claim a batch, publish it, mark what the broker
    /// confirmed, count the failures. How many rows it marked sent.
    pub async fn round(&self, session: &mut B::Session) -> Result<usize, RelayError<B::Error>> {
        let table = self.outbox.table();
        let limit = i64::from(self.batch);
        let tally = self.tally();
        let confirmed = if DB::LOCKS_ROWS {
            let mut transaction = DB::begin_claim(&self.pool).await?;
            let rows = DB::claim(&mut transaction, table, limit).await?;
            let published = self.publish(session, &rows, &tally).await?;
            DB::mark_sent(&mut transaction, table, &published.confirmed).await?;
            self.record_failures(&mut transaction, &published.failed).await?;
            transaction.commit().await?;
            published.confirmed
        } else {
            let rows = DB::claim(&mut *self.pool.acquire().await?, table, limit).await?;
            let published = self.publish(session, &rows, &tally).await?;
            let mut connection = self.pool.acquire().await?;
            DB::mark_sent(&mut connection, table, &published.confirmed).await?;
            self.record_failures(&mut connection, &published.failed).await?;
            published.confirmed
        };
        tally.count(&self.stats.marked, "sent", confirmed.len() as u64);
        Ok(confirmed.len())
    }

    /// The broker's answer for `rows` (none asked for when there are none).
    async fn publish<'r>(
        &self,
        session: &mut B::Session,
        rows: &'r [OutboxRow],
        tally: &Tally<'_>,
    ) -> Result<Published<'r>, RelayError<B::Error>> {
        if rows.is_empty() {
            return Ok(Published::default());
        }
        self.broker
            .publish(session, rows, tally)
            .await
            .map_err(RelayError::Broker)
    }

    /// Count each failed row's attempt; set its next one, or park it.
    async fn record_failures(&self, connection: &mut DB::Connection, failed: &[Failed<'_>]) -> Result<(), sqlx::Error> {
        let table = self.outbox.table();
        let tally = self.tally();
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
                    tally.count(&self.stats.failed, "retried_later", 1);
                    warn!(outbox = %table, id, attempts, retry_in = ?pause, %error, "could not publish the row; trying it again later");
                }
                None => {
                    tally.count(&self.stats.parked, "parked", 1);
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
}

/// A relay's counters, shared by its clones.
#[derive(Debug, Default)]
struct RelayCounters {
    published: AtomicU64,
    marked: AtomicU64,
    returned: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    parked: AtomicU64,
    purged: AtomicU64,
    sessions_lost: AtomicU64,
}

impl RelayCounters {
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
    /// or to a destination that does not exist).
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

    /// A broker that is never reached.
    struct Unreached;

    impl Broker for Unreached {
        type Session = ();
        type Error = std::io::Error;

        fn shown_url(&self) -> String {
            "unreached".into()
        }
        async fn connect(&self, _name: &str) -> Result<(), std::io::Error> {
            Err(std::io::ErrorKind::NotConnected.into())
        }
        async fn publish<'r>(
            &self,
            _: &mut (),
            _: &'r [OutboxRow],
            _: &Tally<'_>,
        ) -> Result<Published<'r>, std::io::Error> {
            Err(std::io::ErrorKind::NotConnected.into())
        }
    }

    impl From<&str> for Unreached {
        fn from(_: &str) -> Self {
            Unreached
        }
    }

    #[tokio::test]
    async fn a_failing_row_waits_longer_after_each_failure() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let relay = Relay::<_, Unreached>::new(pool, Outbox::new(), "nowhere").retry_after(Duration::from_millis(500));
        let pauses: Vec<u64> = [1, 2, 3, 4, 10, 40]
            .map(|n| relay.pause_after(n).as_millis() as u64)
            .to_vec();
        assert_eq!(pauses, [500, 1000, 2000, 4000, 256_000, 300_000]);
        let default = Relay::<_, Unreached>::new(relay.pool.clone(), Outbox::new(), "nowhere");
        assert_eq!(default.pause_after(1), DEFAULT_RETRY_AFTER);
    }
}
