//! A JetStream message as the handler sees it, and where its idempotency key comes from.

use std::fmt;
use std::sync::Arc;

/// The header JetStream deduplicates publishes by, and the relay sets to the outbox
/// row's id: the default key.
pub const MSG_ID: &str = "Nats-Msg-Id";

/// One message, decoded: what an idempotent handler is keyed by and works on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Message<M> {
    /// The idempotency key, as the consumer's [`KeySource`] read it (by default the
    /// `Nats-Msg-Id` header).
    pub key: String,
    /// The body, decoded from JSON.
    pub body: M,
    /// How many times the stream delivered this message, this delivery included.
    pub delivered: u64,
    /// Its subject.
    pub subject: String,
}

/// Where a message's idempotency key comes from.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum KeySource {
    /// The `Nats-Msg-Id` header (what the outbox relay sets).
    #[default]
    MsgId,
    /// Another header of the message.
    Header(String),
    /// A function of the message; `None` when it carries no key.
    With(KeyFn),
}

/// A function that reads a message's key.
pub type KeyFn = Arc<dyn Fn(&async_nats::Message) -> Option<String> + Send + Sync>;

impl KeySource {
    /// A key computed from the message by `key`.
    pub fn with(key: impl Fn(&async_nats::Message) -> Option<String> + Send + Sync + 'static) -> Self {
        KeySource::With(Arc::new(key))
    }

    /// The message's key, or `None` when it has none (or an empty one).
    pub(crate) fn key_of(&self, message: &async_nats::Message) -> Option<String> {
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(name))
                .map(|value| value.as_str().to_owned())
        };
        let key = match self {
            KeySource::MsgId => header(MSG_ID),
            KeySource::Header(name) => header(name),
            KeySource::With(key) => key(message),
        };
        key.filter(|key| !key.is_empty())
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::MsgId => f.write_str("MsgId"),
            KeySource::Header(name) => f.debug_tuple("Header").field(name).finish(),
            KeySource::With(_) => f.write_str("With(..)"),
        }
    }
}
