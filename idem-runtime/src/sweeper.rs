//! Deleting expired records.

#[cfg(feature = "sweeper")]
use std::time::Duration;

use crate::clock;
use crate::error::StoreError;
use crate::store::IdempotencyStore;

/// Records deleted per statement by [`purge_expired`].
pub const DEFAULT_BATCH: u64 = 1000;

/// Delete every record expired by now, in batches of `batch`, and return how many went.
/// Each batch is its own statement, so claims are never blocked behind a long delete.
pub async fn purge_expired(store: &dyn IdempotencyStore, batch: u64) -> Result<u64, StoreError> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = store.purge_expired(clock::now(), batch).await?;
        total += deleted;
        if deleted < batch {
            return Ok(total);
        }
    }
}

/// A store that can purge itself in the background.
#[cfg(feature = "sweeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "sweeper")))]
pub trait Sweeper: IdempotencyStore + Sized {
    /// Spawn a task that runs [`purge_expired`] every `period`, in batches of
    /// [`DEFAULT_BATCH`], until the returned handle is aborted; errors are logged and
    /// retried at the next period.
    fn continuously_purge(self: std::sync::Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        continuously_purge(self, period, DEFAULT_BATCH)
    }
}

#[cfg(feature = "sweeper")]
impl<S: IdempotencyStore> Sweeper for S {}

/// Run [`purge_expired`] on `store` every `period`, `batch` records a statement, until
/// the returned task is aborted; errors are logged and retried at the next period.
#[cfg(feature = "sweeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "sweeper")))]
pub fn continuously_purge(
    store: std::sync::Arc<dyn IdempotencyStore>,
    period: Duration,
    batch: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match purge_expired(&*store, batch).await {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(target: "idem", deleted, "purged expired idempotency records"),
                Err(error) => tracing::warn!(target: "idem", %error, "could not purge expired idempotency records"),
            }
        }
    })
}
