//! The idempotent consumer: each delivery runs the handler, and is acked only after its
//! outcome is recorded.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::StreamExt;
use idem_runtime::observe::shown_key;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Channel;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::answer::within;
use crate::connection::{self, Broker, Setup};
use crate::message::{KeySource, Message};
use crate::observe;
use crate::stall::{self, Activity, Stall};
use idem_messaging::session::{sessions, Role};
use idem_messaging::{Attempts, ConsumerStats, Counters, Disposition, HandlerError, OnFailure, DEFAULT_MAX_ATTEMPTS};

/// Consumes one queue through an idempotent handler, with acks that follow the record.
///
/// Each delivery's body is decoded from JSON into `M` and handed to the handler with its
/// key (the message id by default, see [`KeySource`]). The handler is idempotent itself
/// — an `#[idempotent(key = msg.key, …)]` function, transactional when its effect is in
/// the same database, or a call through [`idem_runtime::Idempotent`] — and the consumer
/// settles the delivery by what it answered:
///
/// | the handler answered | the delivery is |
/// |---|---|
/// | `Ok` (the body ran and its outcome is recorded, or the first answer replayed) | acked |
/// | `Error::Duplicate` (`mode = Reject`), `Error::AnswerNotKept` (only a digest kept), `Error::Expired` or `Error::Erased` (a tombstone: the message ran before, its answer expired or its subject was erased) | acked |
/// | `Error::InProgress` (another consumer has it), `Store`, `LeaseLost`, `Decode`, `NoStore` | not acked: requeued after [`redeliver_after`](Self::redeliver_after) |
/// | `Error::OutcomeUnknown` (a step failed closed: its effect may have happened) | not acked: requeued after the pause, every time, until an operator settles the record (`idem settle`); then the next delivery replays or runs. The message is never dropped or dead-lettered while nobody knows whether it took effect |
/// | the body's own error (its claim released: `on_error = Release`), or a panic in the handler | not acked: requeued after the pause, and runs again — at most [`max_attempts`](Self::max_attempts) times, then the [`OnFailure`] policy |
/// | `Error::PreviousFailed` (`on_error = Record`), `PayloadMismatch`, `InvalidKey`, `Encode` | the [`OnFailure`] policy |
/// | nothing: no key, or a body that is not the JSON of `M` | the [`OnFailure`] policy, unrun |
///
/// A delivery is never acked before the handler returned, so a consumer killed at any
/// point leaves its unacked deliveries to the broker, which delivers them again; the
/// handler then replays the recorded answer (or runs a body whose claim was never
/// committed). The pause before a requeue keeps a message that another consumer is
/// still running from coming back in a hot loop. A handler that panics fails that
/// delivery only: the consumer goes on with the others. A message whose body keeps
/// failing (a poison message) is not requeued forever, starving the messages behind it:
/// after `max_attempts` failed runs in this consumer it meets the failure policy. (The
/// count is this process's; a restarted consumer counts again from zero — a quorum
/// queue's `x-delivery-limit` bounds it across processes.)
///
/// The consumer reconnects by itself when the broker goes away (a restart, a cut
/// connection), with pauses from 100 ms to 5 s; [`on_connect`](Self::on_connect)
/// declares the topology on each new channel. It also opens a new session when the
/// broker stops delivering to an open one while messages are ready (see
/// [`stall_check`](Self::stall_check)): a connection can stay up while nothing reaches
/// its consumer.
#[derive(Clone)]
pub struct Consumer {
    broker: Broker,
    queue: String,
    key: KeySource,
    prefetch: u16,
    redeliver_after: Duration,
    on_failure: OnFailure,
    declare: Option<Setup>,
    stall_check: Duration,
    stats: Arc<Counters>,
    /// The failed runs of each key not yet settled, in this process.
    attempts: Arc<Attempts>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("url", &idem_runtime::redacted_url(&self.broker.url))
            .field("queue", &self.queue)
            .field("key", &self.key)
            .field("prefetch", &self.prefetch)
            .field("redeliver_after", &self.redeliver_after)
            .field("on_failure", &self.on_failure)
            .field("max_attempts", &self.attempts.max())
            .field("stall_check", &self.stall_check)
            .field("connect_timeout", &self.broker.connect_timeout)
            .finish_non_exhaustive()
    }
}

/// How many deliveries are handled at once (and the channel's prefetch) by default.
pub const DEFAULT_PREFETCH: u16 = 16;

/// The pause before a delivery that was not settled is requeued, by default.
pub const DEFAULT_REDELIVER_AFTER: Duration = Duration::from_secs(1);

/// How long a session goes without a delivery, with room for more, before the consumer
/// asks the broker whether messages are ready, by default.
pub const DEFAULT_STALL_CHECK: Duration = Duration::from_secs(30);

impl Consumer {
    /// A consumer of `queue` on the broker at `amqp_url` (`amqp://user:pass@host:5672/%2f`).
    pub fn new(amqp_url: impl Into<String>, queue: impl Into<String>) -> Self {
        Consumer {
            broker: Broker::new(amqp_url.into()),
            queue: queue.into(),
            key: KeySource::default(),
            prefetch: DEFAULT_PREFETCH,
            redeliver_after: DEFAULT_REDELIVER_AFTER,
            on_failure: OnFailure::default(),
            declare: None,
            stall_check: DEFAULT_STALL_CHECK,
            stats: Arc::default(),
            attempts: Arc::new(Attempts::new(DEFAULT_MAX_ATTEMPTS)),
        }
    }

    /// Where each delivery's key comes from (default: the message id).
    pub fn key(mut self, key: KeySource) -> Self {
        self.key = key;
        self
    }

    /// How many deliveries are handled at once, which is also the channel's prefetch
    /// (default 16; at least 1).
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// How long a delivery that was not settled waits before it is requeued (default
    /// 1 s): the time another consumer gets to finish the same message.
    pub fn redeliver_after(mut self, pause: Duration) -> Self {
        self.redeliver_after = pause;
        self
    }

    /// How many times a message's body may fail, or its handler panic, before the
    /// message meets the [`OnFailure`] policy instead of another requeue (default
    /// [`DEFAULT_MAX_ATTEMPTS`]; at least 1). Only the body's own failures count: a
    /// message another consumer is running, or one the store could not claim, is
    /// requeued however often that happens.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.attempts = Arc::new(Attempts::new(attempts));
        self
    }

    /// How long a session may go without a delivery while it has room for more
    /// (fewer than [`prefetch`](Self::prefetch) in hand) before the consumer asks the
    /// broker, by a passive declare of the queue, whether messages are ready (default
    /// [`DEFAULT_STALL_CHECK`], 30 s). If some are, or the broker does not answer
    /// within the same time, the broker is not delivering to this session: a quorum
    /// queue whose leader moved can count deliveries as made to a consumer that never
    /// receives them, and a connection can go silent in one direction only. The session
    /// then takes no more deliveries, lets those in hand finish, and closes (its
    /// unacked deliveries go back to the queue); the next one consumes afresh. An idle
    /// queue costs one passive declare per `quiet`.
    ///
    /// The same time bounds each settlement: an ack, nack or reject that the connection
    /// has not taken by then is given up, and the broker delivers the message again (to
    /// be answered from its record).
    ///
    /// A standby consumer of a single-active-consumer queue is also sent nothing while
    /// messages wait for the active one: it reopens its session each time, harmlessly;
    /// give it a longer `quiet`.
    pub fn stall_check(mut self, quiet: Duration) -> Self {
        self.stall_check = quiet;
        self
    }

    /// How long opening a session on one node may take — connecting, the channel, the
    /// [`on_connect`](Self::on_connect) topology, the prefetch and the consume (default
    /// [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT), 10 s). A node that
    /// takes the connection and never answers (a paused broker, a half-dead host) is
    /// given up after it, and the next node of the cluster is tried; the next sessions
    /// try it after the nodes that answered.
    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.broker.connect_timeout = limit;
        self
    }

    /// What happens to a message that can never succeed (default: dead-lettered).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// The properties of each connection this consumer opens (lapin's: client
    /// properties, an authentication provider, the locale); idem adds only the
    /// connection's name (`idem consumer of QUEUE`). Default: lapin's defaults.
    pub fn connection_properties(mut self, properties: lapin::ConnectionProperties) -> Self {
        self.broker.properties = properties;
        self
    }

    /// Declare exchanges, queues and bindings on each new channel, before consuming.
    pub fn on_connect<F, Fut>(mut self, declare: F) -> Self
    where
        F: Fn(Channel) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), lapin::Error>> + Send + 'static,
    {
        self.declare = Some(connection::setup(declare));
        self
    }

    /// What this consumer (and its clones) did so far.
    pub fn stats(&self) -> ConsumerStats {
        self.stats.snapshot()
    }

    /// Consume until the process ends: sessions one after another, reconnecting when
    /// the broker goes away.
    pub async fn run<M, T, E, H, Fut>(&self, handler: H)
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let shown = idem_runtime::redacted_url(&self.broker.url).to_string();
        let role = Role {
            kind: "consumer",
            name: &self.queue,
            broker: &shown,
        };
        let stats = &self.stats;
        let on_lost = || crate::observe::session_lost("consumer", &self.queue);
        sessions(role, &stats.deliveries, &stats.sessions_lost, on_lost, || {
            self.session(&handler)
        })
        .await;
    }

    /// [`run`](Self::run) until `stop` completes. Deliveries in hand when it does are
    /// left unacked: the broker delivers them again.
    pub async fn run_until<M, T, E, H, Fut>(&self, stop: impl Future<Output = ()>, handler: H)
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        tokio::select! {
            () = stop => {}
            () = self.run(handler) => {}
        }
    }

    /// One connection's worth of deliveries: until the connection or channel fails, or
    /// the broker stops delivering to it ([`stall`](crate::stall)).
    async fn session<M, T, E, H, Fut>(&self, handler: &H) -> Result<(), SessionEnd>
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let name = format!("idem consumer of {}", self.queue);
        let (connection, channel) = connection::open(&self.broker, &name, self.declare.as_ref()).await?;
        let broker = &self.broker;
        broker
            .opening(channel.basic_qos(self.prefetch, BasicQosOptions::default()))
            .await?;
        let deliveries = broker
            .opening(channel.basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ))
            .await?;
        info!(queue = %self.queue, prefetch = self.prefetch, "consuming");
        let activity = Activity::new();
        let stalled = OnceLock::new();
        let watch = async {
            let stall = stall::watch(
                &channel,
                &self.queue,
                usize::from(self.prefetch),
                self.stall_check,
                &activity,
            )
            .await;
            let _ = stalled.set(stall);
        };
        let mut failure = None;
        deliveries
            // A stalled session takes no more deliveries; those in hand finish.
            .take_until(watch)
            .take_while(|delivery| {
                let go_on = match delivery {
                    Ok(_) => true,
                    Err(error) => {
                        failure = Some(error.clone());
                        false
                    }
                };
                activity.heard();
                std::future::ready(go_on)
            })
            .for_each_concurrent(usize::from(self.prefetch), |delivery| async {
                if let Ok(delivery) = delivery {
                    let _held = activity.hold();
                    self.handle(delivery, handler).await;
                }
            })
            .await;
        if let Some(stall) = stalled.into_inner() {
            // The close hands the unacked deliveries back to the queue; a connection
            // gone silent may not answer it.
            let closed = connection.close(
                lapin::protocol::constants::REPLY_SUCCESS,
                "the broker stopped delivering".into(),
            );
            let _ = tokio::time::timeout(self.stall_check, closed).await;
            return Err(SessionEnd::Stalled(stall));
        }
        failure.map_or(Ok(()), |error| Err(error.into()))
    }

    /// Run the handler on one delivery and settle it by the answer.
    async fn handle<M, T, E, H, Fut>(&self, delivery: Delivery, handler: &H)
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.stats.deliveries.fetch_add(1, Ordering::Relaxed);
        if delivery.redelivered {
            self.stats.redelivered.fetch_add(1, Ordering::Relaxed);
            observe::redelivery(&self.queue);
        }
        let Some(message) = self.decode(&delivery) else {
            return self.settle(&delivery, Disposition::Final).await;
        };
        let key = message.key.clone();
        let disposition = idem_messaging::verdict(
            &self.queue,
            &key,
            delivered_before(&delivery),
            &self.attempts,
            handler(message),
        )
        .await;
        self.settle(&delivery, disposition).await;
    }

    /// The delivery as the handler sees it, or `None` (logged) when it has no key or its
    /// body is not the JSON of `M`.
    fn decode<M: DeserializeOwned>(&self, delivery: &Delivery) -> Option<Message<M>> {
        let Some(key) = self.key.key_of(delivery) else {
            warn!(queue = %self.queue, key = ?self.key, "delivery has no idempotency key; not run");
            return None;
        };
        let body = match serde_json::from_slice(&delivery.data) {
            Ok(body) => body,
            Err(error) => {
                warn!(queue = %self.queue, key = %shown_key(&key), %error, "delivery's body does not decode; not run");
                return None;
            }
        };
        Some(Message {
            key,
            body,
            redelivered: delivery.redelivered,
            exchange: delivery.exchange.to_string(),
            routing_key: delivery.routing_key.to_string(),
        })
    }

    /// Ack, requeue after the pause, or apply the failure policy. A settlement that
    /// cannot reach the broker is only logged: the broker delivers the message again.
    async fn settle(&self, delivery: &Delivery, disposition: Disposition) {
        let (acker, limit) = (&delivery.acker, self.stall_check);
        let (counter, settled) = match (disposition, self.on_failure) {
            (Disposition::Ack, _) => (
                (&self.stats.acked, "acked"),
                within(limit, acker.ack(BasicAckOptions::default())).await,
            ),
            (Disposition::Redeliver, _) => {
                tokio::time::sleep(self.redeliver_after).await;
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                (
                    (&self.stats.requeued, "requeued"),
                    within(limit, acker.nack(requeue)).await,
                )
            }
            (Disposition::Final, OnFailure::AckAndDrop) => (
                (&self.stats.failed, "failed"),
                within(limit, acker.ack(BasicAckOptions::default())).await,
            ),
            // `DeadLetter`, and whatever policy a later version adds: the message is
            // kept by the broker's dead-letter route rather than dropped.
            (Disposition::Final, _) => {
                let reject = BasicRejectOptions { requeue: false };
                (
                    (&self.stats.failed, "failed"),
                    within(limit, acker.reject(reject)).await,
                )
            }
        };
        match settled {
            Ok(true) => {
                let (counter, outcome) = counter;
                counter.fetch_add(1, Ordering::Relaxed);
                observe::delivery(&self.queue, outcome);
            }
            Ok(false) => {
                debug!(queue = %self.queue, "the delivery's channel is gone; the broker will deliver it again")
            }
            Err(error) => {
                warn!(queue = %self.queue, %error, "could not settle a delivery; the broker will deliver it again")
            }
        }
    }
}

/// Why a session ended.
#[derive(Debug)]
enum SessionEnd {
    /// The connection or the channel failed.
    Broker(lapin::Error),
    /// The broker stopped delivering to it.
    Stalled(Stall),
}

impl From<lapin::Error> for SessionEnd {
    fn from(error: lapin::Error) -> Self {
        SessionEnd::Broker(error)
    }
}

impl std::fmt::Display for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEnd::Broker(error) => error.fmt(f),
            SessionEnd::Stalled(stall) => write!(f, "stalled: {stall}"),
        }
    }
}

/// How many times the broker delivered this message before: a quorum queue's
/// `x-delivery-count` header (0 on its first delivery, and on a classic queue, which
/// keeps no count).
fn delivered_before(delivery: &Delivery) -> u32 {
    let count = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count").cloned());
    let count = match count {
        Some(AMQPValue::LongLongInt(n)) => n,
        Some(AMQPValue::LongInt(n)) => i64::from(n),
        Some(AMQPValue::ShortInt(n)) => i64::from(n),
        Some(AMQPValue::ShortShortInt(n)) => i64::from(n),
        Some(AMQPValue::LongUInt(n)) => i64::from(n),
        Some(AMQPValue::ShortUInt(n)) => i64::from(n),
        Some(AMQPValue::ShortShortUInt(n)) => i64::from(n),
        _ => 0,
    };
    u32::try_from(count.max(0)).unwrap_or(u32::MAX)
}
