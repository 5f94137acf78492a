//! Deleting expired records.

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

/// Run [`purge_expired`] every `period` for as long as the returned task lives; errors
/// are logged and retried at the next period.
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
                Ok(deleted) => tracing::debug!(deleted, "purged expired idempotency records"),
                Err(error) => tracing::warn!(%error, "could not purge expired idempotency records"),
            }
        }
    })
}
