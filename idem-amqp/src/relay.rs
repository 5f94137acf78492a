//! The outbox relay to RabbitMQ: publishes unsent rows with publisher confirms, and
//! marks them sent only once the broker confirmed them.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use idem_messaging::relay::{Failed, Published, Tally};
use idem_messaging::OutboxRow;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};

use crate::answer::within;
use crate::connection::{self, Setup};

/// How long a relay waits for the broker to take a message and to confirm it, unless
/// told otherwise ([`AmqpBroker::confirm_timeout`]).
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(30);

/// Publishes an outbox's rows to RabbitMQ: idem's [`Relay`](idem_messaging::Relay)
/// over an [`AmqpBroker`].
///
/// ```no_run
/// # async fn example(pool: idem::sqlx::PgPool) {
/// use idem_amqp::{AmqpBroker, Outbox, Relay};
///
/// let relay = Relay::new(pool, Outbox::new(), AmqpBroker::new("amqp://127.0.0.1:5672/%2f"));
/// relay.run().await;
/// # }
/// ```
///
/// Each row goes out as a persistent message (`delivery-mode` 2) with `mandatory` set,
/// the row id as its `message-id` and the row's headers, to the row's exchange and
/// routing key. A row is marked sent once the broker acked it and routed it: a message
/// returned as unroutable (no queue bound), refused (`nack`), or addressed to an
/// exchange that does not exist (checked before publishing, on a channel of its own, so
/// the relay's channel is not closed by it) fails its attempt, and the row waits.
///
/// lapin logs each message the broker returns at `WARN`, payload included (target
/// `lapin::returned_messages`); where payloads are confidential, filter that target
/// (`lapin::returned_messages=error`). The relay's own log line names the row, never
/// its payload.
///
/// A row published but not marked (the relay killed, the broker gone before its
/// confirm) is published again, so a message can arrive twice — which the idempotent
/// [`Consumer`](crate::Consumer) absorbs, keyed by the message id.
pub type Relay<DB> = idem_messaging::Relay<DB, AmqpBroker>;

/// Why a RabbitMQ relay's round failed.
pub type RelayError = idem_messaging::RelayError<lapin::Error>;

/// The RabbitMQ broker (or cluster) a [`Relay`] publishes to: its URL, or its nodes'
/// URLs separated by commas (each session starts at the node after the one last lost),
/// the application's connection properties, and the topology each new channel declares.
#[derive(Clone)]
pub struct AmqpBroker {
    broker: connection::Broker,
    declare: Option<Setup>,
    confirm_timeout: Duration,
}

impl std::fmt::Debug for AmqpBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpBroker")
            .field("url", &idem_runtime::redacted_url(&self.broker.url))
            .field("declares", &self.declare.is_some())
            .field("confirm_timeout", &self.confirm_timeout)
            .field("connect_timeout", &self.broker.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl AmqpBroker {
    /// The broker at `amqp_url` (one URL, or a cluster's nodes' URLs separated by
    /// commas).
    pub fn new(amqp_url: impl Into<String>) -> Self {
        AmqpBroker {
            broker: connection::Broker::new(amqp_url.into()),
            declare: None,
            confirm_timeout: DEFAULT_CONFIRM_TIMEOUT,
        }
    }

    /// How long the relay waits for the broker to take each message and to confirm it
    /// before it takes the connection for dead (default [`DEFAULT_CONFIRM_TIMEOUT`],
    /// 30 s). lapin can leave a publish or a confirm sent just as a node dies
    /// unanswered for ever, and the outbox would wait behind it; given up, the round
    /// fails, the next session starts on the next node, and the rows not confirmed are
    /// published again (a duplicate the [`Consumer`](crate::Consumer) answers from its
    /// record). Set it above the longest confirm the broker takes under load (a quorum
    /// queue confirms once a majority of its nodes wrote the message to disk).
    pub fn confirm_timeout(mut self, limit: Duration) -> Self {
        self.confirm_timeout = limit;
        self
    }

    /// How long opening a session on one node may take — connecting, the channel, the
    /// [`on_connect`](Self::on_connect) topology and confirm mode — and how long the
    /// relay waits for the broker to say whether a row's exchange exists (default
    /// [`DEFAULT_CONNECT_TIMEOUT`](crate::DEFAULT_CONNECT_TIMEOUT), 10 s). A node that
    /// takes the connection and never answers (a paused broker, a half-dead host) is
    /// given up after it, and the next node of the cluster is tried; the next sessions
    /// try it after the nodes that answered.
    pub fn connect_timeout(mut self, limit: Duration) -> Self {
        self.broker.connect_timeout = limit;
        self
    }

    /// The properties of each connection the relay opens (lapin's: client properties,
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
}

impl From<&str> for AmqpBroker {
    fn from(amqp_url: &str) -> Self {
        AmqpBroker::new(amqp_url)
    }
}

impl From<String> for AmqpBroker {
    fn from(amqp_url: String) -> Self {
        AmqpBroker::new(amqp_url)
    }
}

impl From<&String> for AmqpBroker {
    fn from(amqp_url: &String) -> Self {
        AmqpBroker::new(amqp_url.as_str())
    }
}

/// A relay's session on RabbitMQ: a connection, a channel on it in confirm mode, and
/// the exchanges found to exist.
pub struct AmqpSession {
    connection: Connection,
    channel: Channel,
    known: HashSet<String>,
}

impl std::fmt::Debug for AmqpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSession")
            .field("channel", &self.channel.id())
            .field("exchanges", &self.known)
            .finish_non_exhaustive()
    }
}

impl idem_messaging::Broker for AmqpBroker {
    type Session = AmqpSession;
    type Error = lapin::Error;

    fn shown_url(&self) -> String {
        idem_runtime::redacted_url(&self.broker.url).to_string()
    }

    async fn connect(&self, name: &str) -> Result<AmqpSession, lapin::Error> {
        let (connection, channel) = connection::open(&self.broker, name, self.declare.as_ref()).await?;
        self.broker
            .opening(channel.confirm_select(ConfirmSelectOptions::default()))
            .await?;
        Ok(AmqpSession {
            connection,
            channel,
            known: HashSet::new(),
        })
    }

    /// Publish `rows` and wait for every confirm: the ids the broker acked and routed,
    /// and the rows that failed, with why.
    async fn publish<'r>(
        &self,
        session: &mut AmqpSession,
        rows: &'r [OutboxRow],
        tally: &Tally<'_>,
    ) -> Result<Published<'r>, lapin::Error> {
        let mut published = Published::default();
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            let message = &row.message;
            if let Some(missing) = session.missing(&self.broker, &message.exchange).await? {
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
            let publish = session.channel.basic_publish(
                message.exchange.as_str().into(),
                message.routing_key.as_str().into(),
                mandatory,
                &message.payload,
                properties,
            );
            let confirm = within(self.confirm_timeout, publish).await?;
            tally.published(1);
            pending.push((row, confirm));
        }
        // A return comes before its message's ack, but the client hands it to whichever
        // confirm the next ack resolves first (an ack of several messages resolves them
        // in no set order): the return says which row it was by the message id the
        // relay gave it, and only that row failed.
        let mut acked = Vec::with_capacity(pending.len());
        let mut returned = HashMap::new();
        for (row, confirmation) in confirmations(pending, self.confirm_timeout).await? {
            match confirmation {
                Confirmation::Ack(None) => acked.push(row),
                Confirmation::Ack(Some(message)) => {
                    tally.returned();
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
                    tally.refused();
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

    fn count_rows(outbox: &str, outcome: &'static str, n: u64) {
        crate::observe::relay_rows(outbox, outcome, n);
    }

    fn count_session_lost(outbox: &str) {
        crate::observe::session_lost("relay", outbox);
    }
}

impl AmqpSession {
    /// Why `exchange` cannot be published to (it does not exist), or `None`. The
    /// default exchange (`""`) always exists. Each other exchange is looked up once per
    /// session, with a passive declare on a channel of its own: publishing to a missing
    /// exchange would close the relay's channel and end the session, again and again.
    /// Each request of it is bounded by `broker`'s connect timeout.
    async fn missing(&mut self, broker: &connection::Broker, exchange: &str) -> Result<Option<String>, lapin::Error> {
        if exchange.is_empty() || self.known.contains(exchange) {
            return Ok(None);
        }
        let probe = broker.opening(self.connection.create_channel()).await?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = broker
            .opening(probe.exchange_declare(exchange.into(), ExchangeKind::Direct, passive, FieldTable::default()))
            .await;
        match declared {
            Ok(()) => {
                let _ = broker.opening(probe.close(200, "exchange found".into())).await;
                self.known.insert(exchange.to_owned());
                Ok(None)
            }
            // The broker closes the probe's channel with 404 NOT_FOUND.
            Err(error) if not_found(&error) => Ok(Some(format!("exchange {exchange:?} does not exist"))),
            Err(error) => Err(error),
        }
    }
}

/// Each row's confirm, awaited at most `limit`: an error as soon as one fails or stays
/// unanswered (the session is then taken for dead, and the rows are published again in
/// the next).
async fn confirmations<R, C>(pending: Vec<(R, C)>, limit: Duration) -> Result<Vec<(R, Confirmation)>, lapin::Error>
where
    C: Future<Output = lapin::Result<Confirmation>>,
{
    let mut answered = Vec::with_capacity(pending.len());
    for (row, confirm) in pending {
        answered.push((row, within(limit, confirm).await?));
    }
    Ok(answered)
}

/// Whether the broker answered 404 NOT_FOUND.
fn not_found(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp) if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A confirm the broker (or lapin) never answers fails the round after the limit,
    /// instead of holding the outbox behind it.
    #[tokio::test]
    async fn a_confirm_never_answered_fails_the_round() {
        let limit = Duration::from_millis(50);
        let confirms = vec![
            (
                1,
                futures_util::future::Either::Left(async { Ok(Confirmation::Ack(None)) }),
            ),
            (2, futures_util::future::Either::Right(std::future::pending())),
        ];
        let answered = tokio::time::timeout(Duration::from_secs(5), confirmations(confirms, limit))
            .await
            .expect("a confirm never answered held the round past its limit");
        let error = answered.expect_err("a round with a confirm never answered succeeded");
        assert!(error.to_string().contains("no answer within"), "{error}");
    }

    /// Answered confirms are handed back with their rows, in order.
    #[tokio::test]
    async fn answered_confirms_are_handed_back() {
        let confirms = vec![
            (
                1,
                futures_util::future::Either::Left(async { Ok(Confirmation::Ack(None)) }),
            ),
            (
                2,
                futures_util::future::Either::Right(async { Ok(Confirmation::NotRequested) }),
            ),
        ];
        let answered = confirmations(confirms, Duration::from_secs(5)).await.unwrap();
        let rows: Vec<_> = answered.iter().map(|(row, _)| *row).collect();
        assert_eq!(rows, [1, 2]);
        assert!(matches!(answered[1].1, Confirmation::NotRequested));
    }
}
