//! A shared pre-check in front of the store that decides: the seed design's Redis in
//! front of the database, for hot keys across processes.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::record::{Record, Status};
use crate::retention::{AfterExpiry, Retention};
use crate::store::IdempotencyStore;

/// Answers duplicates of succeeded calls from `front` (a Redis store, typically), and
/// leaves every decision to `back` (a SQL store): the claim, the outcome, the lease.
///
/// A claim first reads `front`: a succeeded record there that has not expired and whose
/// payload fingerprint agrees is the answer, without touching `back`. A `FAIL` record
/// is always answered by `back`, so an operator's `idem retry-failed` there takes
/// effect for the next call. Anything else —
/// no record, a running one, an error of `front` — goes to `back`, whose answer
/// stands; a finished record `back` answers with is then copied to `front` (with the
/// same expiry) for the duplicates after it. Every holder write, `get` and purge go to
/// `back` alone. So `front` can lose records, restart empty or be down without any
/// call running twice: it only ever holds copies of records that no longer change, and
/// the SQL claim stays the decision.
#[derive(Debug, Clone)]
pub struct TieredStore<F, B> {
    front: F,
    back: B,
}

impl<F: IdempotencyStore, B: IdempotencyStore> TieredStore<F, B> {
    /// `front` answers finished duplicates; `back` decides.
    pub fn new(front: F, back: B) -> Self {
        Self { front, back }
    }

    /// The pre-check store.
    pub fn front(&self) -> &F {
        &self.front
    }

    /// The store that decides.
    pub fn back(&self) -> &B {
        &self.back
    }

    /// A finished record of `front` that may answer `claim`.
    async fn precheck(&self, claim: &Claim<'_>) -> Option<Record> {
        match self.front.get(claim.biz, claim.key).await {
            Ok(Some(record)) if claim.answered_by(&record) => Some(record),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(target: "idem", %error, biz = claim.biz, key = %crate::observe::shown_key(claim.key), "pre-check store failed; asking the store that decides");
                None
            }
        }
    }

    /// Copy a finished `record` to `front`, expiring when its replay ends (a tombstone
    /// after it is `back`'s to answer), with its subject so that an erasure finds the
    /// copy too; best effort.
    async fn mirror(&self, claim: &Claim<'_>, record: &Record) {
        let replay_until = record.replay_until.unwrap_or(record.expires_at);
        let Ok(left) = replay_until.duration_since(claim.now) else {
            return;
        };
        let left = left.max(Duration::from_millis(1));
        let copy = Claim::new(claim.biz, claim.key, claim.now, Duration::from_secs(1), left)
            .with_fingerprint(record.fingerprint.as_deref());
        let retention = Retention::new(record.subject.clone(), AfterExpiry::NewRequest);
        let written = match self.front.claim(&copy).await {
            Ok(ClaimOutcome::Acquired(lease)) => match (&record.status, &record.response_body) {
                (Status::Succeeded, Some(response)) => {
                    let lease = lease.with_retention(retention);
                    self.front.complete(&lease, response, claim.now, left).await
                }
                _ => self.front.release(&lease).await,
            },
            Ok(ClaimOutcome::Existing(_)) => return,
            Err(error) => Err(error),
        };
        if let Err(error) = written {
            tracing::warn!(target: "idem", %error, biz = claim.biz, key = %crate::observe::shown_key(claim.key), "could not copy a finished record to the pre-check store");
        }
    }
}

#[async_trait]
impl<F: IdempotencyStore, B: IdempotencyStore> IdempotencyStore for TieredStore<F, B> {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        if let Some(record) = self.precheck(claim).await {
            return Ok(ClaimOutcome::Existing(record));
        }
        let outcome = self.back.claim(claim).await?;
        if let ClaimOutcome::Existing(record) = &outcome {
            if claim.answered_by(record) {
                self.mirror(claim, record).await;
            }
        }
        Ok(outcome)
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        self.back.renew(lease, now, lease_for).await
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.back.complete(lease, response, now, ttl).await
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        self.back.fail(lease, message, now, ttl).await
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        self.back.release(lease).await
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        self.back.record_steps(lease, steps).await
    }

    fn seals(&self) -> bool {
        self.front.seals() || self.back.seals()
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<crate::notice::Notice>, StoreError> {
        self.back.watch(biz, key).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.back.get(biz, key).await
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.back.purge_expired(now, limit).await
    }

    /// Erases in `back`, then the copies in `front` (they carry the subject's hash);
    /// counts `back`'s records. A failure of either is the erasure's: run it again.
    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let erased = self.back.erase_subject(subject).await?;
        self.front.erase_subject(subject).await?;
        Ok(erased)
    }
}
