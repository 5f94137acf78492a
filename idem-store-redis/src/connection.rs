//! One Redis server, or a Redis Cluster: the two clients the store runs its scripts on.

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue, RedisResult, ScriptInvocation};

/// The client: a `ConnectionManager` (reconnects; hands back the error of a command
/// in flight when the connection broke, without resending it) or a cluster
/// connection (follows `MOVED`/`ASK` and resends).
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Connection::Single(_) => "Connection::Single",
            Connection::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl Connection {
    /// Run a script (`EVALSHA`, loading it on `NOSCRIPT`).
    pub(crate) async fn invoke<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> RedisResult<T> {
        match self.clone() {
            Connection::Single(mut conn) => invocation.invoke_async(&mut conn).await,
            Connection::Cluster(mut conn) => invocation.invoke_async(&mut conn).await,
        }
    }

    /// Run a command (routed by its key on a cluster).
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self.clone() {
            Connection::Single(mut conn) => cmd.query_async(&mut conn).await,
            Connection::Cluster(mut conn) => cmd.query_async(&mut conn).await,
        }
    }

    /// The server's clock (seconds and microseconds of `TIME`) and what `cmd` answers,
    /// in one round trip: a pipeline, on one server. `None` on a cluster, which would
    /// route the two to different nodes.
    pub(crate) async fn with_server_time<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<Option<((u64, u64), T)>> {
        match self.clone() {
            Connection::Single(mut conn) => redis::pipe()
                .cmd("TIME")
                .add_command(cmd.clone())
                .query_async(&mut conn)
                .await
                .map(Some),
            Connection::Cluster(_) => Ok(None),
        }
    }

    /// The primaries: the one server, or every primary of a cluster (found through
    /// `CLUSTER NODES`).
    pub(crate) async fn primaries(&self) -> RedisResult<Vec<Primary>> {
        match self.clone() {
            Connection::Single(_) => Ok(vec![Primary(None)]),
            Connection::Cluster(mut conn) => {
                let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await?;
                Ok(primaries(&nodes)
                    .into_iter()
                    .map(|address| Primary(Some(address)))
                    .collect())
            }
        }
    }

    /// Run `cmd` on `primary`.
    pub(crate) async fn query_on<T: FromRedisValue>(&self, primary: &Primary, cmd: &Cmd) -> RedisResult<T> {
        match (self.clone(), &primary.0) {
            (Connection::Cluster(mut conn), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                T::from_redis_value(&conn.route_command(cmd, routing).await?)
            }
            _ => self.query(cmd).await,
        }
    }
}

/// One primary: the single server (`None`) or a cluster node's address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Primary(Option<(String, u16)>);

/// The `host`, `port` of every connected primary in a `CLUSTER NODES` answer.
fn primaries(nodes: &str) -> Vec<(String, u16)> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|flag| flag == "master") || flags.contains("fail") {
                return None;
            }
            let address = fields.get(1)?.split('@').next()?;
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460\n\
                     b2 127.0.0.1:7004@17004 slave a1 0 0 1 connected\n\
                     c3 127.0.0.1:7002@17002 master - 0 0 2 connected 5461-10922\n\
                     d4 127.0.0.1:7003@17003 master,fail - 0 0 3 disconnected\n";
        assert_eq!(
            super::primaries(nodes),
            vec![("127.0.0.1".to_owned(), 7001), ("127.0.0.1".to_owned(), 7002)]
        );
    }
}
