//! The outbox relay to JetStream: publishes unsent rows with the row id as their
//! `Nats-Msg-Id`, waits for the stream's publish acks, and marks rows sent only then.

use async_nats::header::HeaderMap;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};
use async_nats::jetstream::{self, context::PublishError};
use idem_messaging::relay::{Failed, Published, Tally};
use idem_messaging::OutboxRow;

use crate::connection::{self, NatsError};
use crate::MSG_ID;

/// Publishes an outbox's rows to NATS JetStream: idem's [`Relay`](idem_messaging::Relay)
/// over a [`JetStreamBroker`].
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool) {
/// use idem_nats::{JetStreamBroker, Outbox, Relay};
///
/// let relay = Relay::new(pool, Outbox::new(), JetStreamBroker::new("nats://127.0.0.1:4222"));
/// relay.run().await;
/// # }
/// ```
///
/// A row goes out to the subject in its routing key (its exchange must be empty: NATS
/// has none), with its headers, its content type as a `Content-Type` header, and the row
/// id as its `Nats-Msg-Id`. The row is marked sent once the stream acked it, a
/// duplicate ack included (the stream already holds the message). A subject no stream
/// takes fails the row's attempt (counted as returned), as does a publish the stream
/// refused (counted as refused); the row waits, and is parked after the relay's bound.
/// An ack that does not come (a server killed, a stream without a leader) ends the
/// session: nothing of its batch is marked, and the batch is published again with the
/// same ids, which the stream drops as duplicates within its duplicate window — and
/// which, after it, the consumer's records absorb.
pub type Relay<DB> = idem_messaging::Relay<DB, JetStreamBroker>;

/// Why a JetStream relay's round failed.
pub type RelayError = idem_messaging::RelayError<NatsError>;

/// The NATS servers a [`Relay`] publishes to: one URL, or a cluster's servers'
/// separated by commas.
#[derive(Debug, Clone)]
pub struct JetStreamBroker {
    servers: String,
}

impl JetStreamBroker {
    /// The servers at `nats_url` (one URL, or several separated by commas).
    pub fn new(nats_url: impl Into<String>) -> Self {
        JetStreamBroker {
            servers: nats_url.into(),
        }
    }
}

impl From<&str> for JetStreamBroker {
    fn from(nats_url: &str) -> Self {
        JetStreamBroker::new(nats_url)
    }
}

impl From<String> for JetStreamBroker {
    fn from(nats_url: String) -> Self {
        JetStreamBroker::new(nats_url)
    }
}

impl From<&String> for JetStreamBroker {
    fn from(nats_url: &String) -> Self {
        JetStreamBroker::new(nats_url.as_str())
    }
}

/// A relay's session on JetStream.
#[derive(Debug)]
pub struct JetStreamSession {
    js: jetstream::Context,
}

impl idem_messaging::Broker for JetStreamBroker {
    type Session = JetStreamSession;
    type Error = NatsError;

    fn shown_url(&self) -> String {
        idem_runtime::redacted_url(&self.servers).to_string()
    }

    async fn connect(&self, name: &str) -> Result<JetStreamSession, NatsError> {
        Ok(JetStreamSession {
            js: connection::open(&self.servers, name).await?,
        })
    }

    async fn publish<'r>(
        &self,
        session: &mut JetStreamSession,
        rows: &'r [OutboxRow],
        tally: &Tally<'_>,
    ) -> Result<Published<'r>, NatsError> {
        let mut published = Published::default();
        let mut pending: Vec<(&OutboxRow, PublishAckFuture)> = Vec::with_capacity(rows.len());
        for row in rows {
            let message = &row.message;
            if !message.exchange.is_empty() {
                let error = format!(
                    "NATS has no exchanges: the row names exchange {:?} (publish to the subject in its routing key, with an empty exchange)",
                    message.exchange
                );
                published.failed.push(Failed { row, error });
                continue;
            }
            let mut headers = HeaderMap::new();
            for (name, value) in &message.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            if let Some(content_type) = &message.content_type {
                headers.insert("Content-Type", content_type.as_str());
            }
            headers.insert(MSG_ID, row.id.to_string().as_str());
            let subject = message.routing_key.clone();
            match session
                .js
                .publish_with_headers(subject, headers, message.payload.clone().into())
                .await
            {
                Ok(ack) => {
                    tally.published(1);
                    pending.push((row, ack));
                }
                Err(error) => match row_failure(&error) {
                    Some(why) => published.failed.push(Failed { row, error: why }),
                    None => return Err(NatsError::new(error)),
                },
            }
        }
        for (row, ack) in pending {
            match ack.await {
                Ok(_) => published.confirmed.push(row.id),
                Err(error) => {
                    let Some(why) = row_failure(&error) else {
                        return Err(NatsError::new(error));
                    };
                    if error.kind() == PublishErrorKind::StreamNotFound {
                        tally.returned();
                    } else {
                        tally.refused();
                    }
                    published.failed.push(Failed { row, error: why });
                }
            }
        }
        Ok(published)
    }
}

/// Why a row failed, when `error` is the row's own failure; `None` when the servers
/// failed (no ack in time, the connection gone) and the session must end.
fn row_failure(error: &PublishError) -> Option<String> {
    match error.kind() {
        PublishErrorKind::StreamNotFound => Some("no stream takes the subject".to_owned()),
        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => None,
        _ => Some(format!("the stream refused the message: {error}")),
    }
}
