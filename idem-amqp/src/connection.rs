//! Connections to the broker that come back: the consumer and the relay run sessions,
//! and start a new one with a growing pause when the broker goes away.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection, ConnectionProperties};
use tracing::{info, warn};

/// What a new channel needs before it is used: exchanges, queues and bindings.
pub(crate) type Setup =
    Arc<dyn Fn(Channel) -> Pin<Box<dyn Future<Output = Result<(), lapin::Error>> + Send>> + Send + Sync>;

/// Wrap a user's topology function.
pub(crate) fn setup<F, Fut>(declare: F) -> Setup
where
    F: Fn(Channel) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), lapin::Error>> + Send + 'static,
{
    Arc::new(move |channel| Box::pin(declare(channel)))
}

/// Where the sessions connect, and with what: the broker's URL and the application's
/// connection properties (its client properties, authentication, locale).
#[derive(Clone)]
pub(crate) struct Broker {
    pub(crate) url: String,
    pub(crate) properties: ConnectionProperties,
}

impl Broker {
    /// The broker at `url`, with lapin's default properties.
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            properties: ConnectionProperties::default(),
        }
    }
}

/// A connection to `broker`, named `name` in the broker's connection list, and a channel
/// on it with the topology declared.
pub(crate) async fn open(
    broker: &Broker,
    name: &str,
    declare: Option<&Setup>,
) -> Result<(Connection, Channel), lapin::Error> {
    let properties = broker.properties.clone().with_connection_name(name.into());
    let connection = Connection::connect(&broker.url, properties).await?;
    let channel = connection.create_channel().await?;
    if let Some(declare) = declare {
        declare(channel.clone()).await?;
    }
    Ok((connection, channel))
}

/// Who runs sessions: the consumer of a queue, or the relay of an outbox.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Role<'a> {
    /// `consumer` or `relay`.
    pub(crate) kind: &'static str,
    /// The queue, or the outbox table.
    pub(crate) name: &'a str,
}

/// Sessions one after another, for ever: each that ends is counted in `lost` (and in
/// the metrics) and logged, and the next starts after a pause — the shortest again
/// when the session made progress (`progress` grew).
pub(crate) async fn sessions<F, Fut>(role: Role<'_>, url: &str, progress: &AtomicU64, lost: &AtomicU64, mut session: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), lapin::Error>>,
{
    let who = format!("{} of {}", role.kind, role.name);
    let mut backoff = Backoff::new();
    loop {
        let before = progress.load(Ordering::Relaxed);
        match session().await {
            Ok(()) => info!(%who, "the broker ended the session; reconnecting"),
            Err(error) => {
                warn!(%who, broker = %idem_runtime::redacted_url(url), %error, "session failed; reconnecting")
            }
        }
        lost.fetch_add(1, Ordering::Relaxed);
        crate::observe::session_lost(role.kind, role.name);
        if progress.load(Ordering::Relaxed) > before {
            backoff.reset();
        }
        backoff.pause().await;
    }
}

/// The pause before the next session: from 100 ms, doubling, at most 5 s; back to the
/// start after a session that did some work.
#[derive(Debug)]
pub(crate) struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MOST: Duration = Duration::from_secs(5);

    pub(crate) fn new() -> Self {
        Backoff(Self::FIRST)
    }

    pub(crate) fn reset(&mut self) {
        self.0 = Self::FIRST;
    }

    pub(crate) async fn pause(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::MOST);
    }
}
