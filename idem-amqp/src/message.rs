//! A delivery as the handler sees it, and where its idempotency key comes from.

use std::fmt;
use std::sync::Arc;

use lapin::message::Delivery;
use lapin::types::AMQPValue;

/// One delivery, decoded: what an idempotent handler is keyed by and works on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Message<M> {
    /// The idempotency key, as the consumer's [`KeySource`] read it (by default the
    /// message id, which the outbox relay sets to the outbox row's id).
    pub key: String,
    /// The body, decoded from JSON.
    pub body: M,
    /// The broker's flag: this message was delivered before and not acked (its consumer
    /// died, or it was requeued).
    pub redelivered: bool,
    /// The exchange it was published to.
    pub exchange: String,
    /// Its routing key.
    pub routing_key: String,
}

/// Where a delivery's idempotency key comes from.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum KeySource {
    /// The AMQP `message-id` property (what the outbox relay sets).
    #[default]
    MessageId,
    /// A header of the message, as a string or an integer.
    Header(String),
    /// A function of the delivery; `None` when it carries no key.
    With(KeyFn),
}

/// A function that reads a delivery's key.
pub type KeyFn = Arc<dyn Fn(&Delivery) -> Option<String> + Send + Sync>;

impl KeySource {
    /// A key computed from the delivery by `key`.
    pub fn with(key: impl Fn(&Delivery) -> Option<String> + Send + Sync + 'static) -> Self {
        KeySource::With(Arc::new(key))
    }

    /// The delivery's key, or `None` when it has none (or an empty one).
    pub(crate) fn key_of(&self, delivery: &Delivery) -> Option<String> {
        let key = match self {
            KeySource::MessageId => delivery.properties.message_id().as_ref().map(|id| id.to_string()),
            KeySource::Header(name) => delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|headers| headers.inner().get(name.as_str()))
                .and_then(header_text),
            KeySource::With(key) => key(delivery),
        };
        key.filter(|key| !key.is_empty())
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::MessageId => f.write_str("MessageId"),
            KeySource::Header(name) => f.debug_tuple("Header").field(name).finish(),
            KeySource::With(_) => f.write_str("With(..)"),
        }
    }
}

/// A header's value as key text: strings and integers.
fn header_text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(text) => Some(String::from_utf8_lossy(text.as_bytes()).into_owned()),
        AMQPValue::ShortString(text) => Some(text.to_string()),
        AMQPValue::ShortShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortShortUInt(n) => Some(n.to_string()),
        AMQPValue::ShortInt(n) => Some(n.to_string()),
        AMQPValue::ShortUInt(n) => Some(n.to_string()),
        AMQPValue::LongInt(n) => Some(n.to_string()),
        AMQPValue::LongUInt(n) => Some(n.to_string()),
        AMQPValue::LongLongInt(n) => Some(n.to_string()),
        _ => None,
    }
}
