//! The outbox relay to JetStream: publishes unsent rows with the row id as their
//! `Nats-Msg-Id`, waits for the stream's publish acks, and marks rows sent only then.

use async_nats::header::HeaderMap;
use async_nats::jetstream::context::{GetStreamByNameErrorKind, PublishAckFuture, PublishErrorKind};
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
/// An ack that does not come (a server killed) or a stream that takes the subject but
/// does not answer (its replicas electing a leader) ends the session: nothing of its batch is marked, and the batch is published again with the
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
            if !is_subject(&message.routing_key) {
                let error = format!(
                    "{:?} is not a NATS subject to publish to (tokens separated by dots, no spaces, no wildcards)",
                    message.routing_key
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
                // Refused before it was sent: larger than the servers take.
                Err(error) if error.kind() == PublishErrorKind::MaxPayloadExceeded => {
                    tally.refused();
                    let error = NotTaken::Refused(error).to_string();
                    published.failed.push(Failed { row, error });
                }
                Err(error) => return Err(NatsError::new(error)),
            }
        }
        for (row, ack) in pending {
            match ack.await {
                Ok(_) => published.confirmed.push(row.id),
                Err(error) => {
                    let why = session.why_not_taken(row, error).await?;
                    match why {
                        NotTaken::NoStream => tally.returned(),
                        NotTaken::Refused(_) => tally.refused(),
                    }
                    published.failed.push(Failed {
                        row,
                        error: why.to_string(),
                    });
                }
            }
        }
        Ok(published)
    }
}

/// Why the stream did not take a row.
enum NotTaken {
    /// No stream takes the row's subject.
    NoStream,
    /// The stream refused the message, saying why.
    Refused(PublishError),
}

impl std::fmt::Display for NotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTaken::NoStream => f.write_str("no stream takes the subject"),
            NotTaken::Refused(error) => write!(f, "the stream refused the message: {error}"),
        }
    }
}

impl JetStreamSession {
    /// Whether `error`, the answer to `row`'s publish, is the row's own failure, and
    /// which; or the servers' (no ack in time, the connection gone, a stream that takes
    /// the subject but has no leader to answer while its replicas elect one), which
    /// ends the session: the batch is published again, with the same ids.
    async fn why_not_taken(&self, row: &OutboxRow, error: PublishError) -> Result<NotTaken, NatsError> {
        match error.kind() {
            // "No responders": no stream takes the subject — or one does and has no
            // leader this moment. Only the stream list tells which.
            PublishErrorKind::StreamNotFound => match self.js.stream_by_subject(row.message.routing_key.as_str()).await
            {
                Err(lookup) if lookup.kind() == GetStreamByNameErrorKind::NotFound => Ok(NotTaken::NoStream),
                Ok(_) => Err(NatsError::new(error)),
                Err(lookup) => Err(NatsError::new(lookup)),
            },
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe | PublishErrorKind::MaxAckPending => {
                Err(NatsError::new(error))
            }
            _ => Ok(NotTaken::Refused(error)),
        }
    }
}

/// Whether `subject` can be published to: tokens separated by dots, none empty, no
/// whitespace, no wildcard.
fn is_subject(subject: &str) -> bool {
    !subject.is_empty()
        && !subject.contains(char::is_whitespace)
        && subject
            .split('.')
            .all(|token| !token.is_empty() && token != "*" && token != ">")
}

#[cfg(test)]
mod tests {
    use super::is_subject;

    #[test]
    fn a_subject_is_dotted_tokens_without_wildcards() {
        assert!(is_subject("orders"));
        assert!(is_subject("orders.eu.placed"));
        for not in [
            "",
            "orders.",
            ".orders",
            "orders..eu",
            "orders.*",
            "orders.>",
            "two words",
        ] {
            assert!(!is_subject(not), "{not:?}");
        }
    }
}
