//! Completion notices on PostgreSQL: a store's one listening connection, which tells the waiters of
//! this process when a record they wait for finishes in another.
//!
//! On PostgreSQL a holder write that ends a wait (complete, fail, release) sends
//! `NOTIFY` in its own statement — so in the write's own transaction, also in
//! transactional mode: the notice is delivered at commit, never before the record is
//! visible — but only for a record a waiter marked `watched`: a notice on every
//! completion would queue every commit of the server behind one lock. The first waiter
//! of a key in a process marks it, after its store's listener listens; the waiter then
//! reads once (the record may have finished meanwhile) and afterwards only when told,
//! before its deadline, or once a second.
//!
//! The listener is one connection of its own per store (not one of the store's pool),
//! started at the first wait. When it drops (a restart, a killed backend) it connects
//! again and every watched key is read: a notice sent meanwhile is lost, its answer is
//! not.

use std::time::Duration;

use idem_runtime::notice::Notices;
use idem_runtime::StoreError;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio::task::AbortHandle;

use crate::error::driver_error;

/// A store's listener: the notices it rings, and its task (which ends with it).
#[derive(Debug)]
pub(crate) struct Listening {
    pub notices: Notices,
    task: AbortHandle,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The channel of the table `name`: `idem_` and a hash of the name (a channel name is
/// an identifier, at most 63 bytes; a table's name may be longer).
pub(crate) fn channel(name: &str) -> String {
    // FNV-1a: the same in every process and every version, unlike the std hashers.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("idem_{hash:016x}")
}

/// The key a notice names, from its payload: the biz's length in characters, `:`, the
/// biz, then the key (any text may be in either).
pub(crate) fn named_key(payload: &str) -> Option<(&str, &str)> {
    let (length, rest) = payload.split_once(':')?;
    let length: usize = length.parse().ok()?;
    let split = rest.char_indices().nth(length).map_or(rest.len(), |(at, _)| at);
    Some(rest.split_at(split))
}

/// How long the listener's connection may take to open before the waiters read on
/// a schedule instead.
const CONNECTING: Duration = Duration::from_secs(2);
/// The pause between attempts to listen again.
const AFTER_ERROR: Duration = Duration::from_millis(100);

/// `write` (a holder write with `?` placeholders) as it also notifies the waiters
/// of the record it wrote, when one marked it `watched`. Still one row per record
/// written, which the caller counts.
pub(crate) fn announced(write: String, name: &str) -> String {
    let channel = channel(name);
    // The notice in the write's own `RETURNING`, evaluated for each row written: a
    // common table expression around the write cost a completion 2–5 µs more (by
    // `pgbench` on a durable server).
    format!(
        "{write} RETURNING CASE WHEN watched THEN \
           pg_notify('{channel}', length(biz_type) || ':' || biz_type || idempotent_key) END"
    )
}

/// Start listening for the table `name`'s completions, on a connection of its own
/// made as `pool`'s are.
pub(crate) async fn start(pool: &PgPool, name: &str) -> Result<Listening, StoreError> {
    let failed = |e| driver_error("listening for completions", e);
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .application_name("idem listener");
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(CONNECTING)
        .connect_lazy_with(options);
    let channel = channel(name);
    let listener = listening_on(&own, &channel).await.map_err(failed)?;
    let notices = Notices::new();
    let task = tokio::spawn(listen(own, listener, channel, notices.clone())).abort_handle();
    Ok(Listening { notices, task })
}

/// A listener on a connection of `pool`, listening on `channel`.
async fn listening_on(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Ring the notices the server sends. When the connection drops, every watched key
/// is read — once the listener listens again, so that a completion after that read
/// is told.
async fn listen(pool: PgPool, mut listener: PgListener, channel: String, notices: Notices) {
    loop {
        match listener.try_recv().await {
            Ok(Some(notice)) => {
                if let Some((biz, key)) = named_key(notice.payload()) {
                    notices.completed(biz, key);
                }
            }
            // Dropped, then connected again and listening (sqlx reconnects at once).
            Ok(None) => notices.lost(),
            Err(error) => {
                tracing::debug!(target: "idem", %error, "the completion listener's connection failed");
                // A listener of its own again: sqlx's would connect again silently.
                drop(listener);
                listener = loop {
                    match listening_on(&pool, &channel).await {
                        Ok(listener) => break listener,
                        Err(error) => {
                            tracing::debug!(target: "idem", %error, "the completion listener could not listen again");
                            tokio::time::sleep(AFTER_ERROR).await;
                        }
                    }
                };
                notices.lost();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_names_its_biz_and_key_whatever_they_hold() {
        assert_eq!(named_key("3:payorder-7"), Some(("pay", "order-7")));
        assert_eq!(named_key("4:p:ä:7:x"), Some(("p:ä:", "7:x")));
        assert_eq!(named_key("2:ab"), Some(("ab", "")));
        assert_eq!(named_key("pay"), None);
    }

    #[test]
    fn a_channel_is_an_identifier_of_the_table() {
        let long = "a".repeat(200);
        assert_eq!(channel(&long).len(), 21);
        assert_eq!(channel("idempotent_record"), channel("idempotent_record"));
        assert_ne!(channel("idempotent_record"), channel("public.idempotent_record"));
    }
}
