//! Connections to the broker that come back: the consumer and the relay run sessions,
//! and start a new one with a growing pause when the broker goes away.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection, ConnectionProperties};

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

/// A connection to `url`, named `name` in the broker's connection list, and a channel
/// on it with the topology declared.
pub(crate) async fn open(
    url: &str,
    name: &str,
    declare: Option<&Setup>,
) -> Result<(Connection, Channel), lapin::Error> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let connection = Connection::connect(url, properties).await?;
    let channel = connection.create_channel().await?;
    if let Some(declare) = declare {
        declare(channel.clone()).await?;
    }
    Ok((connection, channel))
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
