//! An idempotent JetStream consumer: each message runs its handler, which claims the
//! message's key before its body; the message is acked only once its outcome is
//! recorded.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use futures_util::StreamExt;
use idem_messaging::session::{sessions, Role};
use idem_messaging::{Attempts, ConsumerStats, Counters, Disposition, HandlerError, OnFailure, DEFAULT_MAX_ATTEMPTS};
use idem_runtime::observe::shown_key;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::connection::{self, NatsError};
use crate::message::{KeySource, Message};
use crate::window::DuplicateWindow;

/// How many messages a consumer asks for at once, and runs concurrently, by default.
pub const DEFAULT_BATCH: usize = 32;

/// How long a message handed back (`nak`) waits before the stream delivers it again,
/// by default.
pub const DEFAULT_REDELIVER_AFTER: Duration = Duration::from_secs(1);

/// How long the stream waits for a delivered message's settlement, by default: 30 s,
/// JetStream's own default.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// A durable pull consumer of a JetStream stream that runs an idempotent handler per
/// message and settles it by the handler's answer:
///
/// | the handler's answer | the message |
/// |---|---|
/// | `Ok`, or a duplicate answered from the record | acked, and the ack confirmed by the server (`double_ack`) |
/// | in progress elsewhere, a store error, the body's own error (its claim released) | `nak` with a delay: delivered again after [`redeliver_after`](Self::redeliver_after); a body that keeps failing meets the [`OnFailure`] policy after [`max_attempts`](Self::max_attempts) deliveries, counted by the stream across consumers |
/// | it can never succeed (a recorded failure, no key, a body that does not decode) | the [`OnFailure`] policy: `term` (no more deliveries; the server publishes a `MSG_TERMINATED` advisory), or an ack |
///
/// The consumer connects again by itself when its server goes away: give it every node
/// of a cluster (`nats://a:4222,nats://b:4222`).
#[derive(Clone)]
pub struct Consumer {
    servers: String,
    stream: String,
    durable: String,
    key: KeySource,
    batch: usize,
    redeliver_after: Duration,
    ack_wait: Duration,
    attempts: Arc<Attempts>,
    on_failure: OnFailure,
    records_ttl: Option<Duration>,
    stats: Arc<Counters>,
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("servers", &idem_runtime::redacted_url(&self.servers))
            .field("stream", &self.stream)
            .field("durable", &self.durable)
            .field("key", &self.key)
            .field("batch", &self.batch)
            .field("redeliver_after", &self.redeliver_after)
            .field("ack_wait", &self.ack_wait)
            .field("max_attempts", &self.attempts.max())
            .field("on_failure", &self.on_failure)
            .field("records_ttl", &self.records_ttl)
            .finish()
    }
}

impl Consumer {
    /// A consumer of `stream` on the servers at `nats_url` (one URL, or a cluster's,
    /// separated by commas), under the durable consumer name `durable` (made, with
    /// explicit acks, if it does not exist).
    pub fn new(nats_url: impl Into<String>, stream: impl Into<String>, durable: impl Into<String>) -> Self {
        Consumer {
            servers: nats_url.into(),
            stream: stream.into(),
            durable: durable.into(),
            key: KeySource::default(),
            batch: DEFAULT_BATCH,
            redeliver_after: DEFAULT_REDELIVER_AFTER,
            ack_wait: DEFAULT_ACK_WAIT,
            attempts: Arc::new(Attempts::new(DEFAULT_MAX_ATTEMPTS)),
            on_failure: OnFailure::default(),
            records_ttl: None,
            stats: Arc::default(),
        }
    }

    /// Where each message's idempotency key comes from (default: `Nats-Msg-Id`).
    pub fn key(mut self, key: KeySource) -> Self {
        self.key = key;
        self
    }

    /// How many messages are fetched, and run, at once (default [`DEFAULT_BATCH`]; at
    /// least 1).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// How long a message that was not settled waits before it is delivered again
    /// (default [`DEFAULT_REDELIVER_AFTER`]).
    pub fn redeliver_after(mut self, pause: Duration) -> Self {
        self.redeliver_after = pause;
        self
    }

    /// How long the stream waits for a delivered message's settlement before it
    /// delivers the message again — to this consumer or another — when its consumer
    /// died holding it (default [`DEFAULT_ACK_WAIT`], JetStream's). Set when the
    /// durable consumer is made; a handler that runs longer has its message delivered
    /// again while it runs, and that copy is answered `InProgress` and delivered later.
    pub fn ack_wait(mut self, wait: Duration) -> Self {
        self.ack_wait = wait;
        self
    }

    /// How many times a message's body may fail, or its handler panic, before the
    /// message meets the [`OnFailure`] policy (default [`DEFAULT_MAX_ATTEMPTS`]; at
    /// least 1), counted by the stream's own delivery count across consumers.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.attempts = Arc::new(Attempts::new(attempts));
        self
    }

    /// What happens to a message that can never succeed (default: terminated).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// How long the handler's records are kept (its operation's `ttl`). Told it, the
    /// consumer compares it with the stream's duplicate window at each connection, and
    /// logs a warning when the window is shorter ([`DuplicateWindow`]). Default: not
    /// told, not compared.
    pub fn records_ttl(mut self, ttl: Duration) -> Self {
        self.records_ttl = Some(ttl);
        self
    }

    /// The stream's duplicate window against the records' ttl, as the consumer logs it
    /// at each connection: the note when the window is shorter, `None` when it is not
    /// or the consumer was not told the ttl ([`records_ttl`](Self::records_ttl)).
    pub async fn duplicate_window(&self) -> Result<Option<DuplicateWindow>, NatsError> {
        let js = connection::open(&self.servers, &format!("idem consumer of {}", self.stream)).await?;
        let stream = js.get_stream(&self.stream).await.map_err(NatsError::new)?;
        Ok(self.window_note(stream.cached_info()))
    }

    /// The note for the stream described by `info`, when the consumer knows the ttl.
    fn window_note(&self, info: &jetstream::stream::Info) -> Option<DuplicateWindow> {
        DuplicateWindow::check(&self.stream, info.config.duplicate_window, self.records_ttl?)
    }

    /// What this consumer (and its clones) did so far.
    pub fn stats(&self) -> ConsumerStats {
        self.stats.snapshot()
    }

    /// Consume until the process ends, connecting again when the servers go away.
    pub async fn run<M, T, E, H, Fut>(&self, handler: H)
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let shown = idem_runtime::redacted_url(&self.servers).to_string();
        let role = Role {
            kind: "consumer",
            name: &self.stream,
            broker: &shown,
        };
        let stats = &self.stats;
        sessions(
            role,
            &stats.deliveries,
            &stats.sessions_lost,
            || {},
            || self.session(&handler),
        )
        .await;
    }

    /// [`run`](Self::run) until `stop` completes. Messages in hand when it does are left
    /// unacked: the stream delivers them again.
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

    /// One connection's worth of messages: until a fetch fails.
    async fn session<M, T, E, H, Fut>(&self, handler: &H) -> Result<(), NatsError>
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let js = connection::open(&self.servers, &format!("idem consumer of {}", self.stream)).await?;
        let stream = js.get_stream(&self.stream).await.map_err(NatsError::new)?;
        if let Some(note) = self.window_note(stream.cached_info()) {
            warn!(stream = %self.stream, window = ?note.window, records_ttl = ?note.records_ttl, "{note}");
        }
        let consumer = stream
            .get_or_create_consumer(
                &self.durable,
                pull::Config {
                    durable_name: Some(self.durable.clone()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: self.ack_wait,
                    ..Default::default()
                },
            )
            .await
            .map_err(NatsError::new)?;
        info!(stream = %self.stream, consumer = %self.durable, batch = self.batch, "consuming");
        loop {
            let messages = consumer
                .fetch()
                .max_messages(self.batch)
                .expires(Duration::from_secs(1))
                .messages()
                .await
                .map_err(NatsError::new)?;
            let mut failure = None;
            messages
                .take_while(|message| {
                    let go_on = match message {
                        Ok(_) => true,
                        Err(error) => {
                            failure = Some(error.to_string());
                            false
                        }
                    };
                    std::future::ready(go_on)
                })
                .for_each_concurrent(self.batch, |message| async {
                    if let Ok(message) = message {
                        self.handle(message, handler).await;
                    }
                })
                .await;
            if let Some(failure) = failure {
                return Err(NatsError::new(failure));
            }
        }
    }

    /// Run the handler on one message and settle it by the answer.
    async fn handle<M, T, E, H, Fut>(&self, message: jetstream::Message, handler: &H)
    where
        M: DeserializeOwned,
        E: HandlerError,
        H: Fn(Message<M>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.stats.deliveries.fetch_add(1, Ordering::Relaxed);
        let delivered = message.info().map(|info| info.delivered.max(1) as u64).unwrap_or(1);
        if delivered > 1 {
            self.stats.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        let Some(decoded) = self.decode(&message, delivered) else {
            return self.settle(&message, Disposition::Final).await;
        };
        let key = decoded.key.clone();
        let delivered_before = u32::try_from(delivered - 1).unwrap_or(u32::MAX);
        let disposition =
            idem_messaging::verdict(&self.stream, &key, delivered_before, &self.attempts, handler(decoded)).await;
        self.settle(&message, disposition).await;
    }

    /// The message as the handler sees it, or `None` (logged) when it has no key or its
    /// body is not the JSON of `M`.
    fn decode<M: DeserializeOwned>(&self, message: &jetstream::Message, delivered: u64) -> Option<Message<M>> {
        let Some(key) = self.key.key_of(message) else {
            warn!(stream = %self.stream, key = ?self.key, "message has no idempotency key; not run");
            return None;
        };
        let body = match serde_json::from_slice(&message.payload) {
            Ok(body) => body,
            Err(error) => {
                warn!(stream = %self.stream, key = %shown_key(&key), %error, "message's body does not decode; not run");
                return None;
            }
        };
        Some(Message {
            key,
            body,
            delivered,
            subject: message.subject.to_string(),
        })
    }

    /// Ack (confirmed by the server), deliver again after the pause, or apply the failure
    /// policy. A settlement that cannot reach the server is only logged: the stream
    /// delivers the message again after its ack wait.
    async fn settle(&self, message: &jetstream::Message, disposition: Disposition) {
        let (counter, settled) = match (disposition, self.on_failure) {
            (Disposition::Ack, _) => (&self.stats.acked, message.double_ack().await),
            (Disposition::Redeliver, _) => (
                &self.stats.requeued,
                message.ack_with(AckKind::Nak(Some(self.redeliver_after))).await,
            ),
            (Disposition::Final, OnFailure::AckAndDrop) => (&self.stats.failed, message.ack().await),
            // `DeadLetter` and any later policy: no more deliveries, and the server's
            // advisory tells whoever keeps the dead letters.
            (Disposition::Final, _) => (&self.stats.failed, message.ack_with(AckKind::Term).await),
        };
        match settled {
            Ok(()) => {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                debug!(stream = %self.stream, %error, "could not settle a message; the stream will deliver it again")
            }
        }
    }
}
