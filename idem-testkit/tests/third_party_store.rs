//! A store idem does not ship, written against the store trait alone and certified by
//! the kit: every conformance scenario, and two handles on one map racing a takeover.
//! It is what a crate for DynamoDB, Spanner or a company's own store puts in its tests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use idem::store::{Claim, ClaimOutcome, FenceCheck, IdempotencyStore, Lease, Record, Status, StoreError, Tombstone};
use idem_testkit::conformance::calls::Store;
use idem_testkit::{conformance_suite, shared_store_suite};

/// Records in an ordered map under one lock: each call is atomic, as the trait asks.
#[derive(Debug, Clone, Default)]
pub struct BTreeStore {
    records: Arc<Mutex<BTreeMap<(String, String), Record>>>,
}

/// A holder's write, applied only while its lease holds the record.
enum Write<'a> {
    Renew(SystemTime),
    /// Succeeded or failed with the response or message, at an instant, kept so long.
    Finish(Status, &'a str, SystemTime, Duration),
    Steps(&'a str),
}

impl BTreeStore {
    fn id(biz: &str, key: &str) -> (String, String) {
        (biz.to_owned(), key.to_owned())
    }

    fn held(&self, lease: &Lease, write: Write<'_>) -> FenceCheck {
        let mut records = self.records.lock().unwrap();
        let Some(record) = records
            .get_mut(&Self::id(&lease.biz, &lease.key))
            .filter(|record| lease.holds(record))
        else {
            return FenceCheck::Lost;
        };
        match write {
            Write::Renew(until) => {
                record.lease_until = Some(until);
                record.expires_at = record.expires_at.max(until);
            }
            Write::Finish(status, text, now, ttl) => record.finish(status, text, now, ttl, &lease.retention),
            Write::Steps(steps) => record.steps = Some(steps.to_owned()),
        }
        FenceCheck::Held
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for BTreeStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut records = self.records.lock().unwrap();
        let id = Self::id(claim.biz, claim.key);
        if let Some(existing) = records.get(&id).filter(|existing| !claim.admits(existing)) {
            return Ok(ClaimOutcome::Existing(existing.clone()));
        }
        let granted = claim.granted(records.get(&id));
        let lease = Lease::of(&granted);
        records.insert(id, granted);
        Ok(ClaimOutcome::Acquired(lease))
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        Ok(self.held(lease, Write::Renew(now + lease_for)))
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.held(lease, Write::Finish(Status::Succeeded, response, now, ttl)))
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.held(lease, Write::Finish(Status::Failed, message, now, ttl)))
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        let mut records = self.records.lock().unwrap();
        let id = Self::id(&lease.biz, &lease.key);
        match records.get_mut(&id) {
            // Finished steps stay for the retry: the lease lapses at once instead.
            Some(record) if lease.holds(record) && record.steps.is_some() => {
                record.lease_until = Some(record.created_at);
            }
            Some(record) if lease.holds(record) => {
                records.remove(&id);
            }
            _ => return Ok(FenceCheck::Lost),
        }
        Ok(FenceCheck::Held)
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        Ok(self.held(lease, Write::Steps(steps)))
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.records.lock().unwrap().get(&Self::id(biz, key)).cloned())
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        let mut records = self.records.lock().unwrap();
        let expired: Vec<(String, String)> = records
            .iter()
            .filter(|(_, r)| r.is_expired(now) && (r.status != Status::Processing || r.lease_lapsed(now)))
            .map(|(id, _)| id.clone())
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect();
        for id in &expired {
            records.remove(id);
        }
        // Past their replay, finished records keep only a tombstone.
        for record in records.values_mut().filter(|r| r.strippable(now)) {
            record.strip(Tombstone::Expired);
        }
        Ok(expired.len() as u64)
    }

    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let mut records = self.records.lock().unwrap();
        let erased = records
            .values_mut()
            .filter(|r| r.erasable(subject))
            .map(|r| r.strip(Tombstone::Erased));
        Ok(erased.count() as u64)
    }
}

/// One map for the whole test binary, as one database would be: two handles on it are
/// two processes' stores.
fn shared() -> BTreeStore {
    static MAP: std::sync::OnceLock<BTreeStore> = std::sync::OnceLock::new();
    MAP.get_or_init(BTreeStore::default).clone()
}

async fn open_dyn() -> Option<Store> {
    Some(Arc::new(shared()))
}

conformance_suite!(open_dyn());
shared_store_suite!();
