//! A local cache tier in front of any store: the seed design's answer to hot keys.

use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use quick_cache::sync::Cache;
use quick_cache::Equivalent;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::record::{Record, Status};
use crate::store::IdempotencyStore;

type Slot = (String, String);

/// Wraps a store and answers duplicates of succeeded calls from process memory.
///
/// A succeeded record is cached when a claim finds it in the store, and when a call
/// claimed through the cache writes its outcome (the record it wrote, as written).
/// Only `SUCCESS` records are cached: they do not change until they expire, in any
/// process, so a cached copy is as good as the row. A `FAIL` record is always read
/// from the store, because an operator may delete it there (`idem retry-failed`) so
/// that the next call runs again. A claim never
/// trusts an entry past its record's `expires_at` (it is dropped there and then), the
/// cache is bounded by `capacity` records (the least used go first), a `PROCESSING`
/// record is never cached, and a cached record is served only to a claim whose payload
/// fingerprint agrees with it — any other claim goes to the store, whose answer is
/// then not cached either.
///
/// Built on `quick_cache`, a well-kept concurrent cache whose reads do no housekeeping,
/// so a replay's tail latency stays as flat as its median.
///
/// Cloning it is cheap and shares the cache (a clone of `inner` with the same entries).
#[derive(Debug, Clone)]
pub struct CachedStore<S> {
    inner: S,
    finished: Arc<Cache<Slot, Arc<Record>>>,
    /// The calls claimed through this cache and still running: their fence and payload
    /// fingerprint, so that the record their outcome makes is cached as it is written.
    running: Arc<Cache<Slot, (u64, Option<String>)>>,
}

impl<S: IdempotencyStore> CachedStore<S> {
    /// Cache up to `capacity` finished records of `inner`.
    pub fn new(inner: S, capacity: u64) -> Self {
        let capacity = usize::try_from(capacity).unwrap_or(usize::MAX).max(1);
        Self {
            inner,
            finished: Arc::new(Cache::new(capacity)),
            running: Arc::new(Cache::new(capacity)),
        }
    }

    /// The store behind the cache.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many records the cache holds now.
    pub fn cached(&self) -> u64 {
        self.finished.len() as u64
    }
}

impl<S> CachedStore<S> {
    /// A call claimed through this cache wrote its outcome: cache the record a success
    /// made (as the store now holds it), so the duplicates that follow in this process
    /// are answered without a round trip. A failure (`response` `None`) is not cached:
    /// an operator may delete it in the store so that the next call runs again.
    fn finish(&self, lease: &Lease, written: FenceCheck, response: Option<&str>, now: SystemTime, ttl: Duration) {
        // This holder's entry only: a stale holder leaves the new holder's in place.
        let slot = SlotRef(&lease.biz, &lease.key);
        let Some((_, (fence, fingerprint))) = self.running.remove_if(&slot, |(fence, _)| *fence == lease.fence) else {
            return;
        };
        let (FenceCheck::Held, Some(response)) = (written, response) else {
            return;
        };
        let mut record = Record {
            biz: lease.biz.clone(),
            key: lease.key.clone(),
            status: Status::Processing,
            fence,
            fingerprint,
            request_body: None,
            response_body: None,
            error_message: None,
            lease_until: None,
            created_at: lease.created_at,
            completed_at: None,
            expires_at: now,
            steps: None,
            subject: None,
            replay_until: None,
            tombstone: None,
        };
        record.finish(Status::Succeeded, response, now, ttl, &lease.retention);
        self.finished
            .insert((lease.biz.clone(), lease.key.clone()), Arc::new(record));
    }
}

/// `(biz, key)` borrowed from a claim: looks up a cached `(String, String)` without
/// allocating one. The derived `Hash` hashes the two fields in order, as the tuple does.
#[derive(Hash)]
struct SlotRef<'a>(&'a str, &'a str);

impl Equivalent<Slot> for SlotRef<'_> {
    fn equivalent(&self, slot: &Slot) -> bool {
        self.0 == slot.0 && self.1 == slot.1
    }
}

#[async_trait]
impl<S: IdempotencyStore> IdempotencyStore for CachedStore<S> {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let slot = SlotRef(claim.biz, claim.key);
        if let Some(record) = self.finished.get(&slot) {
            if claim.answered_by(&record) {
                return Ok(ClaimOutcome::Existing(Record::clone(&record)));
            }
            if record.is_expired(claim.now) {
                self.finished.remove(&slot);
            }
        }
        let outcome = self.inner.claim(claim).await?;
        match &outcome {
            ClaimOutcome::Existing(record) if claim.answered_by(record) => {
                self.finished
                    .insert((claim.biz.to_owned(), claim.key.to_owned()), Arc::new(record.clone()));
            }
            // A new life of the key: whatever an earlier life left here is stale.
            ClaimOutcome::Acquired(lease) => {
                self.finished.remove(&slot);
                let fingerprint = claim.fingerprint.map(str::to_owned);
                self.running
                    .insert((claim.biz.to_owned(), claim.key.to_owned()), (lease.fence, fingerprint));
            }
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
        let written = self.inner.complete(lease, response, now, ttl).await?;
        self.finish(lease, written, Some(response), now, ttl);
        Ok(written)
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        let written = self.inner.fail(lease, message, now, ttl).await?;
        self.finish(lease, written, None, now, ttl);
        Ok(written)
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.running.remove(&SlotRef(&lease.biz, &lease.key));
        self.inner.release(lease).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        self.inner.record_steps(lease, steps).await
    }

    fn seals(&self) -> bool {
        self.inner.seals()
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<crate::notice::Notice>, StoreError> {
        self.inner.watch(biz, key).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.get(biz, key).await
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.inner.purge_expired(now, limit).await
    }

    /// Erases in the store, then drops this cache's copies of the subject's records.
    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let erased = self.inner.erase_subject(subject).await?;
        self.finished
            .retain(|_, record| record.subject.as_deref() != Some(subject));
        Ok(erased)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, RandomState};

    #[test]
    fn a_borrowed_slot_hashes_as_the_owned_one() {
        let state = RandomState::new();
        let owned: Slot = ("pay".to_owned(), "k-1".to_owned());
        assert_eq!(state.hash_one(SlotRef("pay", "k-1")), state.hash_one(&owned));
        assert!(SlotRef("pay", "k-1").equivalent(&owned));
        assert!(!SlotRef("pay", "k-2").equivalent(&owned));
    }
}
