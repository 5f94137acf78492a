//! A store in process memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::record::{Record, Status};
use crate::store::IdempotencyStore;

/// Records by biz, then by key: two levels, so a lookup borrows the caller's `&str`s
/// instead of allocating a `(String, String)` to search with.
type Shelves = HashMap<String, HashMap<String, Record>>;

/// Records kept in a map behind a mutex, in this process only.
///
/// A real store, not a test double: every operation is atomic under the lock and
/// follows the same rules as the database stores, so it serves single-process services,
/// tests and benchmarks. Records are lost when the process ends; use a database store
/// where retries may reach another process or outlive a restart.
///
/// Cloning it is cheap: a clone is another handle on the same records.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    shelves: Arc<Mutex<Shelves>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records the store holds, expired ones included.
    pub fn len(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Shelves> {
        // A panic while holding the lock cannot leave a record half-written: every
        // mutation below is a single assignment, so the map is usable after poisoning.
        self.shelves.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Apply `write` to the record held under `lease`, if it is still held.
    fn write_held(&self, lease: &Lease, write: impl FnOnce(&mut Record)) -> FenceCheck {
        let mut shelves = self.lock();
        match shelves.get_mut(&lease.biz).and_then(|shelf| shelf.get_mut(&lease.key)) {
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
        let mut shelves = self.lock();
        let existing = shelves.get(claim.biz).and_then(|shelf| shelf.get(claim.key));
        if let Some(record) = existing.filter(|record| !claim.admits(record)) {
            return Ok(ClaimOutcome::Existing(record.clone()));
        }
        let granted = claim.granted(existing);
        let lease = Lease::of(&granted);
        let shelf = match shelves.get_mut(claim.biz) {
            Some(shelf) => shelf,
            None => shelves.entry(claim.biz.to_owned()).or_default(),
        };
        shelf.insert(claim.key.to_owned(), granted);
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
        let mut shelves = self.lock();
        let Some(shelf) = shelves.get_mut(&lease.biz) else {
            return Ok(FenceCheck::Lost);
        };
        match shelf.get(&lease.key) {
            Some(record) if lease.holds(record) => {
                shelf.remove(&lease.key);
                Ok(FenceCheck::Held)
            }
            _ => Ok(FenceCheck::Lost),
        }
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(biz).and_then(|shelf| shelf.get(key)).cloned())
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        let mut shelves = self.lock();
        let mut left = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut purged = 0;
        for shelf in shelves.values_mut() {
            if left == 0 {
                break;
            }
            let doomed: Vec<String> = shelf
                .iter()
                .filter(|(_, record)| purgeable(record, now))
                .map(|(key, _)| key.clone())
                .take(left)
                .collect();
            for key in &doomed {
                shelf.remove(key);
            }
            left -= doomed.len();
            purged += doomed.len() as u64;
        }
        shelves.retain(|_, shelf| !shelf.is_empty());
        Ok(purged)
    }
}

/// Expired, and not a `Processing` claim whose lease still runs (DESIGN §3, scenario 25).
pub(crate) fn purgeable(record: &Record, now: SystemTime) -> bool {
    record.is_expired(now) && (record.status != Status::Processing || record.lease_lapsed(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row the purge guard is for: expired, yet `Processing` under a running lease.
    /// The executor never leaves one (a claim's expiry is never before its lease ends), so
    /// it is written here by hand.
    #[tokio::test]
    async fn purge_never_deletes_a_running_claim() {
        let store = MemoryStore::new();
        let now = crate::clock::now();
        let hour = Duration::from_secs(3600);
        for (key, lease_until) in [("running", now + hour), ("lapsed", now - hour)] {
            let claim = Claim::new("purge", key, now - 2 * hour, hour, hour);
            let mut record = claim.granted(None);
            record.lease_until = Some(lease_until);
            record.expires_at = now - hour;
            store
                .lock()
                .entry("purge".into())
                .or_default()
                .insert(key.into(), record);
        }
        assert_eq!(store.purge_expired(now, 100).await.unwrap(), 1);
        assert!(store.get("purge", "running").await.unwrap().is_some());
        assert!(store.get("purge", "lapsed").await.unwrap().is_none());
    }
}
