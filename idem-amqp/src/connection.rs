//! Connections to RabbitMQ: the broker's nodes, the first that answers from the one
//! after the node last lost, and the topology declared on each new channel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::{Channel, Connection, ConnectionProperties};
use tracing::warn;

use crate::answer::within;

/// How long opening a session on one node may take (connecting, the channel, the
/// topology it declares, and what the consumer or the relay asks before it starts),
/// unless told otherwise: a node that takes connections and never answers (a paused
/// broker, a half-dead host) is given up after it, and the next node is tried.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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

/// Where the sessions connect, and with what: the broker's URL (or its cluster's nodes'
/// URLs, separated by commas) and the application's connection properties (its client
/// properties, authentication, locale).
#[derive(Clone)]
pub(crate) struct Broker {
    pub(crate) url: String,
    /// The nodes, in the order given.
    nodes: Arc<[String]>,
    /// The node the next session tries first: the one after the node the last session
    /// lost, so that a dead node is tried last.
    next: Arc<AtomicUsize>,
    /// The nodes whose last attempt failed or was given up, one bit each (the first
    /// 64): the next sessions try them after the others, so that a node that never
    /// answers costs its timeout once, not at every turn of the rotation.
    failed: Arc<AtomicU64>,
    pub(crate) properties: ConnectionProperties,
    /// How long opening a session on one node may take.
    pub(crate) connect_timeout: Duration,
}

impl Broker {
    /// The broker at `url` (one URL, or several separated by commas), with lapin's
    /// default properties.
    pub(crate) fn new(url: String) -> Self {
        Self {
            nodes: nodes_of(&url).into(),
            url,
            next: Arc::default(),
            failed: Arc::default(),
            properties: ConnectionProperties::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// The order the next session tries the nodes in: from the one after the node last
    /// lost, those whose last attempt failed moved to the end.
    fn order(&self) -> Vec<usize> {
        order(
            self.nodes.len(),
            self.next.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    /// Note how the last attempt on `node` went.
    fn attempted(&self, node: usize, failed: bool) {
        let bit = node_bit(node);
        if failed {
            self.failed.fetch_or(bit, Ordering::Relaxed);
        } else {
            self.failed.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// `request`, a step of opening a session, given up (and taken for failed) once the
    /// connect timeout has passed without its answer.
    pub(crate) async fn opening<T>(&self, request: impl Future<Output = lapin::Result<T>>) -> lapin::Result<T> {
        within(self.connect_timeout, request).await.map_err(lapin::Error::from)
    }
}

/// `node`'s bit in a set of failed nodes (none past the 64th: those are never put
/// off).
fn node_bit(node: usize) -> u64 {
    u32::try_from(node).ok().and_then(|n| 1u64.checked_shl(n)).unwrap_or(0)
}

/// `nodes` nodes in turn from `first`, those in `failed` after the others (each group
/// in turn).
fn order(nodes: usize, first: usize, failed: u64) -> Vec<usize> {
    let turn = (0..nodes).map(|i| (first + i) % nodes);
    let (answered, put_off): (Vec<usize>, Vec<usize>) = turn.partition(|&node| failed & node_bit(node) == 0);
    answered.into_iter().chain(put_off).collect()
}

/// The nodes' URLs in `url`: split at each comma that starts another `amqp://` or
/// `amqps://` URL (a comma inside a URL stays in it).
fn nodes_of(url: &str) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for part in url.split(',') {
        let trimmed = part.trim();
        match nodes.last_mut() {
            Some(last) if !(trimmed.starts_with("amqp://") || trimmed.starts_with("amqps://")) => {
                last.push(',');
                last.push_str(part);
            }
            _ => nodes.push(trimmed.to_owned()),
        }
    }
    nodes
}

/// A connection to `broker` (the first of its nodes that answers, from the one after
/// the node last lost), named `name` in the broker's connection list, and a channel on
/// it with the topology declared. A node that has not answered all of it within the
/// broker's connect timeout is given up for the next; lapin keeps the half-open
/// connection (its socket and I/O thread) until that node answers or closes it, since
/// it has no way to drop one whose handshake has not finished.
pub(crate) async fn open(
    broker: &Broker,
    name: &str,
    declare: Option<&Setup>,
) -> Result<(Connection, Channel), lapin::Error> {
    let properties = broker.properties.clone().with_connection_name(name.into());
    let mut failure = None;
    for node in broker.order() {
        let opened = async {
            let connection = Connection::connect(&broker.nodes[node], properties.clone()).await?;
            let channel = connection.create_channel().await?;
            if let Some(declare) = declare {
                declare(channel.clone()).await?;
            }
            Ok::<_, lapin::Error>((connection, channel))
        };
        match broker.opening(opened).await {
            Ok(opened) => {
                // Should this node be lost, the next session starts with the one after it.
                broker.next.store(node + 1, Ordering::Relaxed);
                broker.attempted(node, false);
                return Ok(opened);
            }
            Err(error) => {
                broker.attempted(node, true);
                warn!(broker = %idem_runtime::redacted_url(&broker.nodes[node]), %error, "cannot connect; trying the next node");
                failure = Some(error);
            }
        }
    }
    Err(
        failure.unwrap_or(lapin::Error::from(lapin::ErrorKind::InvalidConnectionState(
            lapin::ConnectionState::Closed,
        ))),
    )
}

#[cfg(test)]
mod tests {
    use super::{node_bit, nodes_of, order};

    #[test]
    fn nodes_are_tried_in_turn_and_those_that_failed_last() {
        assert_eq!(order(3, 0, 0), [0, 1, 2]);
        assert_eq!(order(3, 2, 0), [2, 0, 1]);
        assert_eq!(order(3, 1, node_bit(1)), [2, 0, 1]);
        assert_eq!(order(3, 1, node_bit(2)), [1, 0, 2]);
        assert_eq!(order(3, 0, node_bit(0) | node_bit(2)), [1, 0, 2]);
        assert_eq!(order(3, 4, u64::MAX), [1, 2, 0]);
        // Past the 64th node, a node is never put off.
        assert_eq!(node_bit(64), 0);
        assert_eq!(order(66, 64, u64::MAX)[..2], [64, 65]);
    }

    #[test]
    fn a_cluster_url_names_each_node_and_a_comma_inside_a_url_stays_there() {
        assert_eq!(nodes_of("amqp://a:5672/%2f"), ["amqp://a:5672/%2f"]);
        assert_eq!(
            nodes_of("amqp://a:1/%2f, amqps://b:2/%2f,amqp://c:3/v?x=1,2"),
            ["amqp://a:1/%2f", "amqps://b:2/%2f", "amqp://c:3/v?x=1,2"]
        );
    }
}
