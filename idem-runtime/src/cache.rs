//! A local cache tier in front of any store: the seed design's answer to hot keys.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use moka::sync::Cache;

use crate::claim::{fingerprints_agree, Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::record::{Record, Status};
use crate::store::IdempotencyStore;

type Slot = (String, String);

/// Wraps a store and answers duplicates of finished calls from process memory.
///
/// Only finished records (`SUCCESS`, `FAIL`) are cached: they do not change until they
/// expire, in any process, so a cached copy is as good as the row. Entries leave at
/// their record's `expires_at` (and a claim never trusts one past it), the cache is
/// bounded by `capacity` records (least recently used go first), a `PROCESSING` record
/// is never cached, and a cached record is served only to a claim whose payload
/// fingerprint agrees with it — any other claim goes to the store, whose answer is
/// then not cached either.
///
/// Built on `moka`, a well-kept concurrent cache with per-entry expiry.
#[derive(Debug)]
pub struct CachedStore<S> {
    inner: S,
    finished: Cache<Slot, Arc<Record>>,
}

impl<S: IdempotencyStore> CachedStore<S> {
    /// Cache up to `capacity` finished records of `inner`.
    pub fn new(inner: S, capacity: u64) -> Self {
        let finished = Cache::builder()
            .max_capacity(capacity)
            .expire_after(UntilRecordExpires)
            .build();
        Self { inner, finished }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many records the cache holds now (approximately: moka counts lazily).
    pub fn cached(&self) -> u64 {
        self.finished.run_pending_tasks();
        self.finished.entry_count()
    }
}

/// Each entry lives until its record's `expires_at`.
struct UntilRecordExpires;

impl moka::Expiry<Slot, Arc<Record>> for UntilRecordExpires {
    fn expire_after_create(&self, _: &Slot, record: &Arc<Record>, _: Instant) -> Option<Duration> {
        Some(
            record
                .expires_at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO),
        )
    }
}

#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for CachedStore<S> {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let slot = (claim.biz.to_owned(), claim.key.to_owned());
        if let Some(record) = self.finished.get(&slot) {
            if !record.is_expired(claim.now) && fingerprints_agree(record.fingerprint.as_deref(), claim.fingerprint) {
                return Ok(ClaimOutcome::Existing(Record::clone(&record)));
            }
        }
        let outcome = self.inner.claim(claim).await?;
        match &outcome {
            ClaimOutcome::Existing(record)
                if record.status != Status::Processing
                    && !record.is_expired(claim.now)
                    && fingerprints_agree(record.fingerprint.as_deref(), claim.fingerprint) =>
            {
                self.finished.insert(slot, Arc::new(record.clone()));
            }
            // A new life of the key: whatever an earlier life left here is stale.
            ClaimOutcome::Acquired(_) => self.finished.invalidate(&slot),
            ClaimOutcome::Existing(_) => {}
        }
        Ok(outcome)
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.inner.renew(lease, now, lease_for).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.inner.complete(lease, response, now, ttl).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.inner.fail(lease, message, now, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.inner.release(lease).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.get(biz, key).await
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.inner.purge_expired(now, limit).await
    }
}
