//! Completion notices on Redis: a holder's end publishes the record's key when a waiter
//! marked the record `watched`, and one pub/sub connection per store rings the waiters
//! of this process.
//!
//! The publish is in the holder's write script, after the write: a waiter that hears it
//! reads the record finished. Only a watched record publishes, so a store nobody waits
//! on sends nothing. The subscriber connects at the first wait; when its connection
//! drops it subscribes again — on the next server of the list, for a cluster, where a
//! publish reaches every node — and only then has every watched key read, so a notice
//! lost meanwhile costs a read, never an answer.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use idem_runtime::notice::{Notice, Notices};
use idem_runtime::StoreError;
use redis::Script;
use tokio::sync::OnceCell;
use tokio::task::AbortHandle;

/// Marks a record in progress as watched. KEYS[1] the record. Returns 1 when marked, 0
/// when the record is finished or gone.
static WATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('HGET', KEYS[1], 'status') == 'PROCESSING' then \
         redis.call('HSET', KEYS[1], 'watched', '1') return 1 end return 0",
    )
});

/// The pause between attempts to subscribe again.
const AFTER_ERROR: Duration = Duration::from_millis(100);

/// Where a store's notices come from: the servers to subscribe on (none: waiters read on
/// a schedule), and the subscriber once started.
#[derive(Clone, Default)]
pub(crate) struct Listener {
    servers: Arc<[redis::Client]>,
    started: Arc<OnceCell<Listening>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("servers", &self.servers.len())
            .field("started", &self.started.initialized())
            .finish()
    }
}

/// A started subscriber: the notices it rings, and its task (which ends with it).
struct Listening {
    notices: Notices,
    task: AbortHandle,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Subscribe on `servers` (tried in turn), once a waiter asks.
    pub(crate) fn on(servers: Vec<redis::Client>) -> Listener {
        Listener {
            servers: servers.into(),
            started: Arc::default(),
        }
    }

    /// The same servers, for a store whose channel differs (another prefix).
    pub(crate) fn renewed(&self) -> Listener {
        Listener::on(self.servers.to_vec())
    }

    /// Watch the record `record_key` of `(biz, key)`, the subscriber started on
    /// `channel` first: `None` where no server is known or the record is not in
    /// progress.
    pub(crate) async fn watch(
        &self,
        conn: &crate::connection::Connection,
        channel: &str,
        record_key: &str,
        (biz, key): (&str, &str),
        prefix: &str,
    ) -> Result<Option<Notice>, StoreError> {
        if self.servers.is_empty() {
            return Ok(None);
        }
        let listening = self
            .started
            .get_or_try_init(|| start(self.servers.clone(), channel.to_owned(), prefix.to_owned()))
            .await?;
        let notice = listening.notices.watch(biz, key);
        let mut invocation = WATCH.prepare_invoke();
        invocation.key(record_key);
        let marked: i64 = conn
            .invoke(&invocation)
            .await
            .map_err(|e| crate::store::failed("watching a record", e))?;
        Ok((marked == 1).then_some(notice))
    }
}

/// A subscription on `channel` on the first of `servers` that takes it, from `first`.
async fn subscribed(
    servers: &[redis::Client],
    first: usize,
    channel: &str,
) -> Result<(redis::aio::PubSub, usize), redis::RedisError> {
    let mut last = None;
    for turn in 0..servers.len() {
        let at = (first + turn) % servers.len();
        let attempt = async {
            let mut pubsub = servers[at].get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        match attempt.await {
            Ok(pubsub) => return Ok((pubsub, at)),
            Err(error) => last = Some(error),
        }
    }
    Err(last.expect("at least one server"))
}

async fn start(servers: Arc<[redis::Client]>, channel: String, prefix: String) -> Result<Listening, StoreError> {
    let (pubsub, at) = subscribed(&servers, 0, &channel)
        .await
        .map_err(|e| crate::store::failed("subscribing to completions", e))?;
    let notices = Notices::new();
    let task = tokio::spawn(listen(servers, at, pubsub, channel, prefix, notices.clone())).abort_handle();
    Ok(Listening { notices, task })
}

/// Ring the notices published on the channel; when the subscription ends (its
/// connection dropped), subscribe again and then have every watched key read.
async fn listen(
    servers: Arc<[redis::Client]>,
    mut at: usize,
    mut pubsub: redis::aio::PubSub,
    channel: String,
    prefix: String,
    notices: Notices,
) {
    loop {
        {
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                let Ok(record_key) = message.get_payload::<String>() else {
                    continue;
                };
                if let Some((biz, key)) = named_by(&prefix, &record_key) {
                    notices.completed(biz, key);
                }
            }
        }
        tracing::debug!(target: "idem", "the completion subscriber's connection ended");
        (pubsub, at) = loop {
            match subscribed(&servers, at + 1, &channel).await {
                Ok(subscribed) => break subscribed,
                Err(error) => {
                    tracing::debug!(target: "idem", %error, "the completion subscriber could not subscribe again");
                    tokio::time::sleep(AFTER_ERROR).await;
                }
            }
        };
        notices.lost();
    }
}

/// The `(biz, key)` of the record key `record_key` (`{prefix}{<biz length>:<biz>:<key>}`).
pub(crate) fn named_by<'a>(prefix: &str, record_key: &'a str) -> Option<(&'a str, &'a str)> {
    let tagged = record_key.strip_prefix(prefix)?.strip_prefix('{')?.strip_suffix('}')?;
    let (length, rest) = tagged.split_once(':')?;
    let length: usize = length.parse().ok()?;
    let biz = rest.get(..length)?;
    let key = rest.get(length..)?.strip_prefix(':')?;
    Some((biz, key))
}

#[cfg(test)]
mod tests {
    use super::named_by;

    #[test]
    fn a_record_key_names_its_biz_and_key() {
        assert_eq!(named_by("idem:", "idem:{3:pay:order-7}"), Some(("pay", "order-7")));
        assert_eq!(named_by("idem:", "idem:{4:p:ä:7:x}"), Some(("p:ä", "7:x")));
        assert_eq!(named_by("idem:", "other:{3:pay:order-7}"), None);
        assert_eq!(named_by("idem:", "idem:{9:pay:order-7}"), None);
    }
}
