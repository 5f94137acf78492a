//! Connections to NATS: a server, or a cluster's servers, and the error every broker
//! failure comes as.

use async_nats::jetstream;

/// A failure of the NATS servers or of the connection to them: the session it happened
/// in ends, and a new one is started.
#[derive(Debug)]
pub struct NatsError(async_nats::Error);

impl NatsError {
    /// A failure from the client, as `error`.
    pub(crate) fn new(error: impl Into<async_nats::Error>) -> Self {
        NatsError(error.into())
    }
}

impl std::fmt::Display for NatsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for NatsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// A JetStream context on the servers at `servers` (one URL, or several separated by
/// commas: the client tries each and moves to another when its server goes away),
/// named `name` in the servers' connection list.
pub(crate) async fn open(servers: &str, name: &str) -> Result<jetstream::Context, NatsError> {
    let addresses: Vec<async_nats::ServerAddr> = servers
        .split(',')
        .map(|server| server.trim().parse())
        .collect::<Result<_, _>>()
        .map_err(NatsError::new)?;
    let client = async_nats::ConnectOptions::new()
        .name(name)
        .connect(addresses)
        .await
        .map_err(NatsError::new)?;
    Ok(jetstream::new(client))
}
