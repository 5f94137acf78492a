//! Broken stores, to prove the kit fails them.
//!
//! A kit that certifies stores is code that must fail: a store that would run a body
//! twice, or hand one caller another's answer, must fail at least one of its scenarios.
//! [`MutantStore`] is a small, correct store (records in a map under one lock) that can
//! carry one [`Bug`] — each a mistake a store written against the trait could make. The
//! kit's own tests run every scenario of [`conformance_suite!`](crate::conformance_suite)
//! against each mutant and require a failure, and against the correct store and require
//! none. [`ShortLeases`] breaks one guard of a real store, shared by processes: the
//! chaos runner's `--broken-guard` runs its workload on it.
//!
//! ```
//! use idem_testkit::mutants::{Bug, MutantStore};
//!
//! let correct = MutantStore::new(None);
//! let broken = MutantStore::new(Some(Bug::RenewKeepsExpiry));
//! assert_eq!(broken.bug(), Some(Bug::RenewKeepsExpiry));
//! # let _ = correct;
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem::store::{Claim, ClaimOutcome, FenceCheck, Lease, StoreError};
use idem::{IdempotencyStore, Record, Status};

/// One mistake a store can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// The claim reads, then writes in a second step without checking again: two
    /// concurrent claims of a free key are both granted.
    NonAtomicClaim,
    /// Holder writes (renew, complete, fail, release, steps) are applied whatever the
    /// fence: a holder that was taken over still writes over its successor.
    FenceIgnored,
    /// A takeover keeps the old holder's fence instead of raising it.
    FenceNotRaised,
    /// `get` answers the first read of each key forever, as a cache that never
    /// refreshes would.
    StaleGet,
    /// A running lease is taken over when half of it is left.
    EarlyTakeover,
    /// A renewal extends the lease but not the record's expiry: a body that outlives its
    /// `ttl` can be claimed again as an expired record.
    RenewKeepsExpiry,
    /// Purge deletes expired records whose lease still runs. (The store keeps a
    /// record's expiry as its claim set it, and guards a running claim by its lease
    /// alone: a renewed body outlives its expiry, and the purge takes it.)
    PurgeDeletesRunningClaims,
    /// The payload fingerprint is not compared: another payload takes over or replays.
    FingerprintIgnored,
    /// A release deletes the record even when it holds finished steps.
    ReleaseDropsSteps,
    /// A completed record expires at once instead of after its `ttl`.
    CompleteIgnoresTtl,
    /// Every claim answers the existing record as it was stored, without granting a
    /// takeover of a lapsed lease: a holder that died keeps its key forever.
    TakeoverNeverGranted,
}

impl Bug {
    /// Every bug.
    pub const ALL: [Bug; 11] = [
        Bug::NonAtomicClaim,
        Bug::FenceIgnored,
        Bug::FenceNotRaised,
        Bug::StaleGet,
        Bug::EarlyTakeover,
        Bug::RenewKeepsExpiry,
        Bug::PurgeDeletesRunningClaims,
        Bug::FingerprintIgnored,
        Bug::ReleaseDropsSteps,
        Bug::CompleteIgnoresTtl,
        Bug::TakeoverNeverGranted,
    ];
}

type Id = (String, String);

/// A store of records in a map under one lock, correct unless it carries a [`Bug`].
/// Clones share the map.
#[derive(Debug, Clone)]
pub struct MutantStore {
    records: Arc<Mutex<BTreeMap<Id, Record>>>,
    first_reads: Arc<Mutex<BTreeMap<Id, Option<Record>>>>,
    bug: Option<Bug>,
}

/// A holder's write.
enum Write<'a> {
    Renew(SystemTime),
    Finish(Status, &'a str, SystemTime, Duration),
    Steps(&'a str),
}

impl MutantStore {
    /// A store carrying `bug` (`None`: a correct store).
    pub fn new(bug: Option<Bug>) -> Self {
        Self {
            records: Arc::default(),
            first_reads: Arc::default(),
            bug,
        }
    }

    /// The bug this store carries.
    pub fn bug(&self) -> Option<Bug> {
        self.bug
    }

    /// Whether this store carries `bug`.
    fn bites(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    fn id(biz: &str, key: &str) -> Id {
        (biz.to_owned(), key.to_owned())
    }

    fn write(&self, lease: &Lease, write: Write<'_>) -> FenceCheck {
        let ignore_fence = self.bites(Bug::FenceIgnored);
        let mut records = self.records.lock().unwrap();
        let Some(record) = records
            .get_mut(&Self::id(&lease.biz, &lease.key))
            .filter(|record| ignore_fence || lease.holds(record))
        else {
            return FenceCheck::Lost;
        };
        match write {
            Write::Renew(until) => {
                record.lease_until = Some(until);
                let kept = self.bites(Bug::PurgeDeletesRunningClaims) || self.bites(Bug::RenewKeepsExpiry);
                if !kept {
                    record.expires_at = record.expires_at.max(until);
                }
            }
            Write::Finish(status, text, now, ttl) => {
                let kept = if self.bites(Bug::CompleteIgnoresTtl) {
                    Duration::ZERO
                } else {
                    ttl
                };
                record.finish(status, text, now, kept, &lease.retention);
            }
            Write::Steps(steps) => record.steps = Some(steps.to_owned()),
        }
        FenceCheck::Held
    }

    /// Grant `claim`, over `existing` (what the claim read).
    fn grant(&self, records: &mut BTreeMap<Id, Record>, claim: &Claim<'_>, existing: Option<&Record>) -> Lease {
        let mut granted = claim.granted(existing);
        if let Some(old) = existing.filter(|old| !old.is_expired(claim.now)) {
            if self.bites(Bug::FenceNotRaised) {
                granted.fence = old.fence;
            }
        }
        let lease = Lease::of(&granted);
        records.insert(Self::id(claim.biz, claim.key), granted);
        lease
    }

    /// Whether `claim` may take `existing`, as this store (and its bug) judges it.
    fn admits(&self, claim: &Claim<'_>, existing: &Record) -> bool {
        let running = existing.status == Status::Processing && !existing.lease_lapsed(claim.now);
        if self.bites(Bug::PurgeDeletesRunningClaims) && running {
            return false;
        }
        if self.bites(Bug::TakeoverNeverGranted) {
            return existing.is_expired(claim.now);
        }
        if self.bites(Bug::EarlyTakeover) {
            let mut early = *claim;
            early.now += claim.lease / 2;
            return early.admits(existing);
        }
        if self.bites(Bug::FingerprintIgnored) {
            return claim.with_fingerprint(None).admits(existing);
        }
        claim.admits(existing)
    }
}

#[async_trait]
impl IdempotencyStore for MutantStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let id = Self::id(claim.biz, claim.key);
        let existing = {
            let mut records = self.records.lock().unwrap();
            let existing = records.get(&id).cloned();
            if let Some(existing) = existing.as_ref().filter(|existing| !self.admits(claim, existing)) {
                return Ok(ClaimOutcome::Existing(existing.clone()));
            }
            if !self.bites(Bug::NonAtomicClaim) {
                return Ok(ClaimOutcome::Acquired(self.grant(
                    &mut records,
                    claim,
                    existing.as_ref(),
                )));
            }
            existing
        };
        // The read above and the write below are two steps: another claim may run
        // between them, and is not looked at again.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut records = self.records.lock().unwrap();
        Ok(ClaimOutcome::Acquired(self.grant(
            &mut records,
            claim,
            existing.as_ref(),
        )))
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        Ok(self.write(lease, Write::Renew(now + lease_for)))
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.write(lease, Write::Finish(Status::Succeeded, response, now, ttl)))
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.write(lease, Write::Finish(Status::Failed, message, now, ttl)))
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        let drop_steps = self.bites(Bug::ReleaseDropsSteps);
        let ignore_fence = self.bites(Bug::FenceIgnored);
        let mut records = self.records.lock().unwrap();
        let id = Self::id(&lease.biz, &lease.key);
        match records.get_mut(&id) {
            Some(record) if !(ignore_fence || lease.holds(record)) => Ok(FenceCheck::Lost),
            // Finished steps stay for the retry: the lease lapses at once instead.
            Some(record) if record.steps.is_some() && !drop_steps => {
                record.lease_until = Some(record.created_at);
                Ok(FenceCheck::Held)
            }
            Some(_) => {
                records.remove(&id);
                Ok(FenceCheck::Held)
            }
            None => Ok(FenceCheck::Lost),
        }
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        Ok(self.write(lease, Write::Steps(steps)))
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let id = Self::id(biz, key);
        let now = self.records.lock().unwrap().get(&id).cloned();
        if self.bites(Bug::StaleGet) {
            return Ok(self.first_reads.lock().unwrap().entry(id).or_insert(now).clone());
        }
        Ok(now)
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        let running_too = self.bites(Bug::PurgeDeletesRunningClaims);
        let mut records = self.records.lock().unwrap();
        let expired: Vec<Id> = records
            .iter()
            .filter(|(_, r)| {
                r.is_expired(now) && (running_too || r.status != Status::Processing || r.lease_lapsed(now))
            })
            .map(|(id, _)| id.clone())
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect();
        for id in &expired {
            records.remove(id);
        }
        for record in records.values_mut().filter(|r| r.strippable(now)) {
            record.strip(idem::Tombstone::Expired);
        }
        Ok(expired.len() as u64)
    }

    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let mut records = self.records.lock().unwrap();
        let mut erased = 0;
        for record in records.values_mut().filter(|r| r.erasable(subject)) {
            record.strip(idem::Tombstone::Erased);
            erased += 1;
        }
        Ok(erased)
    }
}

/// A real store with one broken guard, for a workload across processes (the chaos
/// runner's `--broken-guard`): one claim in `every` is granted a lease a hundredth of
/// the length asked, while its holder renews on the schedule of the lease it asked for
/// — as a store that wrote the lease in one unit and read it in another would. A
/// duplicate arriving in between takes over a live body: a double execution no fault
/// explains, which a checker must report.
#[derive(Debug, Clone)]
pub struct ShortLeases {
    inner: Arc<dyn IdempotencyStore>,
    every: u64,
    claims: Arc<AtomicU64>,
}

impl ShortLeases {
    /// `inner`, with one claim in `every` granted a short lease.
    pub fn new(inner: Arc<dyn IdempotencyStore>, every: u64) -> Self {
        Self {
            inner,
            every: every.max(1),
            claims: Arc::default(),
        }
    }
}

#[async_trait]
impl IdempotencyStore for ShortLeases {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut claim = *claim;
        if self.claims.fetch_add(1, Ordering::Relaxed).is_multiple_of(self.every) {
            claim.lease /= 100;
        }
        self.inner.claim(&claim).await
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

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        self.inner.record_steps(lease, steps).await
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn watch(&self, biz: &str, key: &str) -> Result<Option<idem::store::Notice>, StoreError> {
        self.inner.watch(biz, key).await
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        self.inner.get(biz, key).await
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        self.inner.purge_expired(now, limit).await
    }

    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        self.inner.erase_subject(subject).await
    }
}
