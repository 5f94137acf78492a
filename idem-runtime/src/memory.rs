//! A store in process memory.

use std::hash::RandomState;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use hashbrown::hash_map::EntryRef;

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::clock::{LeaseClock, SteadyClock};
use crate::error::StoreError;
use crate::pages::{Page, RecordPages, Rewrite};
use crate::record::{Record, Status};
use crate::retention::Tombstone;
use crate::store::IdempotencyStore;

/// Records by biz, then by key: two levels, so a lookup borrows the caller's `&str`s
/// instead of allocating a `(String, String)` to search with.
///
/// The biz level is hashed with `foldhash`, seeded at random for each store: a service's
/// biz names are its own (an operation's, fixed in its code), never its callers', so
/// they need no defence against chosen collisions, and a claim and a completion each
/// hash one name with SipHash instead of two.
type Shelves = hashbrown::HashMap<String, Map<Box<Filed>>, foldhash::fast::RandomState>;

/// A record as the store keeps it: its biz and key are the names it is filed under,
/// so the record itself holds neither (a new key is copied into the map and the lease,
/// not into the record as well). [`named`](Self::named) gives the whole record back.
#[derive(Debug)]
struct Filed {
    /// The record, with its `biz` and `key` empty.
    record: Record,
}

impl Filed {
    /// The record, named by the `biz` and `key` it is filed under.
    fn named(&self, biz: &str, key: &str) -> Record {
        Record {
            biz: biz.to_owned(),
            key: key.to_owned(),
            ..self.record.clone()
        }
    }
}

/// A map by name, hashed with std's keyed SipHash (keys are callers' request ids, which
/// must not be able to pick colliding keys). `hashbrown`'s, for [`entry_ref`]: a claim
/// of a new key hashes it once and copies it only to insert it.
///
/// [`entry_ref`]: hashbrown::HashMap::entry_ref
type Map<V> = hashbrown::HashMap<String, V, RandomState>;

/// The fewest claims between two sweeps of expired records.
const SWEEP_EVERY: usize = 1024;

/// The records, and how many claims were granted since expired ones were swept out.
#[derive(Debug, Default)]
struct Shelf {
    shelves: Shelves,
    claims_since_sweep: usize,
}

/// Records kept in a map behind a mutex, in this process only.
///
/// A real store, not a test double: every operation is atomic under the lock and
/// follows the same rules as the database stores, so it serves single-process services,
/// tests and benchmarks. Records are lost when the process ends; use a database store
/// where retries may reach another process or outlive a restart.
///
/// It does not grow without bound: claims sweep out expired records as they go (after
/// at least 1,024 claims, and at least half as many claims as there are records, so a
/// sweep costs each claim O(1) on average). No sweeper task is needed; memory holds the
/// records live within their `ttl` (or `lease`), and at most about as many again.
///
/// Leases and expiry are judged by the store's own steady clock
/// ([`LeaseClock::Store`]): it starts from the system clock when the store is made and
/// then moves with the monotonic clock only (and with tokio's paused test clock), so a
/// step of the system clock mid-body — an NTP step, a VM resumed from suspend — neither
/// ends a running lease early nor keeps a record past its time. A test that hands the
/// store instants of its own through the store trait (a claim an hour ago) builds it
/// with [`with_lease_clock(LeaseClock::Caller)`](Self::with_lease_clock).
///
/// Cloning it is cheap: a clone is another handle on the same records.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shelves: Arc<Mutex<Shelf>>,
    clock: LeaseClock,
    steady: SteadyClock,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            shelves: Arc::default(),
            clock: LeaseClock::Store,
            steady: SteadyClock::start(),
        }
    }
}

impl MemoryStore {
    /// An empty store, judging leases by its steady clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same store, judging leases and expiry by `clock`: its steady clock
    /// ([`LeaseClock::Store`], the default) or the instants its callers pass
    /// ([`LeaseClock::Caller`]: for tests that claim at chosen instants).
    pub fn with_lease_clock(mut self, clock: LeaseClock) -> Self {
        self.clock = clock;
        self
    }

    /// The instant a call is judged at: `given` by the caller, or the steady clock's.
    fn judged_at(&self, given: SystemTime) -> SystemTime {
        match self.clock {
            LeaseClock::Store => self.steady.now(),
            LeaseClock::Caller => given,
        }
    }

    /// How many records the store holds, expired ones not yet swept out included.
    pub fn len(&self) -> usize {
        count(&self.lock().shelves)
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Shelf> {
        // A panic while holding the lock cannot leave a record half-written: every
        // mutation below is a single assignment, so the map is usable after poisoning.
        self.shelves.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Apply `write` to the record held under `lease`, if it is still held.
    fn write_held(&self, lease: &Lease, write: impl FnOnce(&mut Record)) -> FenceCheck {
        let mut shelves = self.lock();
        match shelves
            .shelves
            .get_mut(&lease.biz)
            .and_then(|shelf| shelf.get_mut(&lease.key))
        {
            Some(filed) if lease.holds(&filed.record) => {
                write(&mut filed.record);
                FenceCheck::Held
            }
            _ => FenceCheck::Lost,
        }
    }
}

#[async_trait]
impl IdempotencyStore for MemoryStore {
    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimOutcome, StoreError> {
        let now = match (self.clock, claim.read) {
            // The steady clock at the moment the caller read its own: no second read.
            (LeaseClock::Store, Some(read)) => self.steady.at(read),
            _ => self.judged_at(claim.now),
        };
        let claim = &Claim { now, ..*claim };
        let mut guard = self.lock();
        guard.sweep_if_due(claim.now);
        let shelf = guard.shelves.entry_ref(claim.biz).or_default();
        let granted = match shelf.entry_ref(claim.key) {
            EntryRef::Occupied(mut held) => {
                let filed = held.get_mut();
                if !claim.admits(&filed.record) {
                    return Ok(ClaimOutcome::Existing(filed.named(claim.biz, claim.key)));
                }
                filed.record = claim.granted_unnamed(Some(&filed.record));
                Lease::new(claim.biz, claim.key, filed.record.fence, filed.record.created_at)
            }
            EntryRef::Vacant(free) => {
                let record = claim.granted_unnamed(None);
                let lease = Lease::new(claim.biz, claim.key, record.fence, record.created_at);
                free.insert(Box::new(Filed { record }));
                lease
            }
        };
        Ok(ClaimOutcome::Acquired(granted))
    }

    async fn renew(&self, lease: &Lease, now: SystemTime, lease_for: Duration) -> Result<FenceCheck, StoreError> {
        let now = self.judged_at(now);
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
        let now = self.judged_at(now);
        Ok(self.write_held(lease, |record| {
            record.finish(Status::Succeeded, response, now, ttl, &lease.retention)
        }))
    }

    async fn fail(
        &self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> Result<FenceCheck, StoreError> {
        let now = self.judged_at(now);
        Ok(self.write_held(lease, |record| {
            record.finish(Status::Failed, message, now, ttl, &lease.retention)
        }))
    }

    async fn release(&self, lease: &Lease) -> Result<FenceCheck, StoreError> {
        let mut shelves = self.lock();
        let Some(shelf) = shelves.shelves.get_mut(&lease.biz) else {
            return Ok(FenceCheck::Lost);
        };
        match shelf.get_mut(&lease.key).map(|filed| &mut filed.record) {
            Some(record) if lease.holds(record) && record.steps.is_some() => {
                record.lease_until = Some(record.created_at);
                Ok(FenceCheck::Held)
            }
            Some(record) if lease.holds(record) => {
                shelf.remove(&lease.key);
                Ok(FenceCheck::Held)
            }
            _ => Ok(FenceCheck::Lost),
        }
    }

    async fn record_steps(&self, lease: &Lease, steps: &str) -> Result<FenceCheck, StoreError> {
        Ok(self.write_held(lease, |record| record.steps = Some(steps.to_owned())))
    }

    async fn get(&self, biz: &str, key: &str) -> Result<Option<Record>, StoreError> {
        Ok(self
            .lock()
            .shelves
            .get(biz)
            .and_then(|shelf| shelf.get(key))
            .map(|filed| filed.named(biz, key)))
    }

    async fn purge_expired(&self, now: SystemTime, limit: u64) -> Result<u64, StoreError> {
        let now = self.judged_at(now);
        let mut guard = self.lock();
        let shelves = &mut guard.shelves;
        let mut left = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut purged = 0;
        for shelf in shelves.values_mut() {
            if left == 0 {
                break;
            }
            let doomed: Vec<String> = shelf
                .iter()
                .filter(|(_, filed)| purgeable(&filed.record, now))
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
        let strippable = shelves
            .values_mut()
            .flat_map(Map::values_mut)
            .map(|filed| &mut filed.record)
            .filter(|record| record.strippable(now));
        for record in strippable.take(usize::try_from(limit).unwrap_or(usize::MAX)) {
            record.strip(Tombstone::Expired);
        }
        Ok(purged)
    }

    async fn erase_subject(&self, subject: &str) -> Result<u64, StoreError> {
        let mut guard = self.lock();
        let mut erased = 0;
        for filed in guard.shelves.values_mut().flat_map(Map::values_mut) {
            let record = &mut filed.record;
            if record.erasable(subject) {
                record.strip(Tombstone::Erased);
                erased += 1;
            }
        }
        Ok(erased)
    }
}

/// Records in `(biz, key)` order ([`Page::by_key`]).
#[async_trait]
impl RecordPages for MemoryStore {
    async fn page(&self, cursor: &str, limit: u32) -> Result<Page, StoreError> {
        let after = Page::after_key(cursor);
        let guard = self.lock();
        let mut records: Vec<((&str, &str), &Filed)> = guard
            .shelves
            .iter()
            .flat_map(|(biz, shelf)| {
                shelf
                    .iter()
                    .map(move |(key, filed)| ((biz.as_str(), key.as_str()), &**filed))
            })
            .filter(|(names, _)| after.is_none_or(|after| *names > after))
            .collect();
        records.sort_by_key(|&(names, _)| names);
        records.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        let records = records.into_iter().map(|((biz, key), filed)| filed.named(biz, key));
        Ok(Page::by_key(records.collect(), limit))
    }

    async fn replace_values(&self, rewrites: &[Rewrite]) -> Result<u64, StoreError> {
        let mut guard = self.lock();
        let mut replaced = 0;
        for Rewrite { read, with } in rewrites {
            let record = guard
                .shelves
                .get_mut(&read.biz)
                .and_then(|shelf| shelf.get_mut(&read.key))
                .map(|filed| &mut filed.record);
            if let Some(record) = record.filter(|record| record.same_values(read)) {
                record.request_body.clone_from(&with.request_body);
                record.response_body.clone_from(&with.response_body);
                record.error_message.clone_from(&with.error_message);
                record.steps.clone_from(&with.steps);
                replaced += 1;
            }
        }
        Ok(replaced)
    }
}

fn count(shelves: &Shelves) -> usize {
    shelves.values().map(Map::len).sum()
}

impl Shelf {
    /// Sweep out every purgeable record once enough claims were granted since the last
    /// sweep: at least [`SWEEP_EVERY`], and at least half the records held.
    fn sweep_if_due(&mut self, now: SystemTime) {
        self.claims_since_sweep += 1;
        if self.claims_since_sweep < SWEEP_EVERY || self.claims_since_sweep < count(&self.shelves) / 2 {
            return;
        }
        self.claims_since_sweep = 0;
        for shelf in self.shelves.values_mut() {
            shelf.retain(|_, filed| !purgeable(&filed.record, now));
        }
        self.shelves.retain(|_, shelf| !shelf.is_empty());
    }
}

/// Expired, and not a `Processing` claim whose lease still runs (scenario 25).
pub(crate) fn purgeable(record: &Record, now: SystemTime) -> bool {
    record.is_expired(now) && (record.status != Status::Processing || record.lease_lapsed(now))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long run of short-lived calls: the store holds the live records and the
    /// expired ones of at most one sweep interval, not every record ever claimed.
    #[tokio::test]
    async fn memory_stays_flat_over_a_long_run_of_short_ttl_calls() {
        let store = MemoryStore::new();
        let op = crate::Idempotent::new("flat")
            .ttl(Duration::from_millis(1))
            .lease(Duration::from_millis(1))
            .store(Arc::new(store.clone()));
        let mut most = 0;
        for i in 0..50_000u32 {
            let _: u32 = op.execute(i, async move { Ok::<_, crate::Error>(i) }).await.unwrap();
            if i % 100 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await; // let the early ones expire
            }
            most = most.max(store.len());
        }
        assert!(most <= 4 * SWEEP_EVERY, "at most {most} records held over 50,000 calls");
    }

    /// A duplicate whose instant is a minute ahead — the system clock stepped forward
    /// while the body runs — meets the running lease, judged by the store's steady
    /// clock; judged by the caller's instants, it would take the lease over.
    #[tokio::test]
    async fn a_step_of_the_system_clock_does_not_end_a_running_lease() {
        let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
        for (clock, taken_over) in [(LeaseClock::Store, false), (LeaseClock::Caller, true)] {
            let store = MemoryStore::new().with_lease_clock(clock);
            let now = crate::clock::now();
            let first = Claim::new("step", "k", now, 10 * second, hour);
            assert!(matches!(store.claim(&first).await.unwrap(), ClaimOutcome::Acquired(_)));
            let stepped = Claim::new("step", "k", now + 60 * second, 10 * second, hour);
            let outcome = store.claim(&stepped).await.unwrap();
            assert_eq!(
                matches!(outcome, ClaimOutcome::Acquired(_)),
                taken_over,
                "{clock:?}: {outcome:?}"
            );
        }
    }

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
                .shelves
                .entry("purge".into())
                .or_default()
                .insert(key.into(), Box::new(Filed { record }));
        }
        assert_eq!(store.purge_expired(now, 100).await.unwrap(), 1);
        assert!(store.get("purge", "running").await.unwrap().is_some());
        assert!(store.get("purge", "lapsed").await.unwrap().is_none());
    }
}
