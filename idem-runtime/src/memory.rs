//! A store in process memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::record::{Record, Status};
use crate::store::IdempotencyStore;

type RecordKey = (String, String);

/// Records kept in a map behind a mutex, in this process only.
///
/// A real store, not a test double: every operation is atomic under the lock and
/// follows the same rules as the database stores, so it serves single-process services,
/// tests and benchmarks. Records are lost when the process ends; use a database store
/// where retries may reach another process or outlive a restart.
#[derive(Debug, Default)]
pub struct MemoryStore {
    records: Mutex<HashMap<RecordKey, Record>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records the store holds, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordKey, Record>> {
        // A panic while holding the lock cannot leave a record half-written: every
        // mutation below is a single assignment, so the map is usable after poisoning.
        self.records.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Apply `write` to the record held under `lease`, if it is still held.
    fn write_held(&self, lease: &Lease, write: impl FnOnce(&mut Record)) -> FenceCheck {
        let mut records = self.lock();
        match records.get_mut(&(lease.biz.clone(), lease.key.clone())) {
            Some(record) if lease.holds(record) => {
                write(record);
                FenceCheck::Held
            }
            _ => FenceCheck::Lost,
        }
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut records = self.lock();
        let slot = (claim.biz.to_owned(), claim.key.to_owned());
        let existing = records.get(&slot);
        if let Some(record) = existing.filter(|record| !claim.admits(record)) {
            return Ok(ClaimOutcome::Existing(record.clone()));
        }
        let granted = claim.granted(existing);
        let lease = Lease::of(&granted);
        records.insert(slot, granted);
        Ok(ClaimOutcome::Acquired(lease))
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        Ok(self.write_held(lease, |record| {
            let until = now + lease_for;
            record.lease_until = Some(until);
            record.expires_at = record.expires_at.max(until);
        }))
    }

    async fn complete(
        &self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.write_held(lease, |record| {
            record.status = Status::Succeeded;
            record.response_body = Some(response.to_owned());
            record.lease_until = Some(now);
            record.completed_at = Some(now);
            record.expires_at = now + ttl;
        }))
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        Ok(self.write_held(lease, |record| {
            record.status = Status::Failed;
            record.error_message = Some(message.to_owned());
            record.lease_until = Some(now);
            record.completed_at = Some(now);
            record.expires_at = now + ttl;
        }))
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        let mut records = self.lock();
        let slot = (lease.biz.clone(), lease.key.clone());
        match records.get(&slot) {
            Some(record) if lease.holds(record) => {
                records.remove(&slot);
                Ok(FenceCheck::Held)
            }
            _ => Ok(FenceCheck::Lost),
        }
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(&(biz.to_owned(), key.to_owned())).cloned())
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        let mut records = self.lock();
        let doomed: Vec<RecordKey> = records
            .iter()
            .filter(|(_, record)| purgeable(record, now))
            .map(|(slot, _)| slot.clone())
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect();
        for slot in &doomed {
            records.remove(slot);
        }
        Ok(doomed.len() as u64)
    }
}

/// Expired, and not a `Processing` claim whose lease still runs (DESIGN §3, scenario 25).
pub(crate) fn purgeable(record: &Record, now: SystemTime) -> bool {
    record.is_expired(now) && (record.status != Status::Processing || record.lease_lapsed(now))
}
