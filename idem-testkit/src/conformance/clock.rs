//! Leases judged by the store's clock: a caller whose instants run minutes ahead of the
//! store's, or behind it, neither takes over a running claim nor keeps one past its
//! lease; expiry counts from the store's completion. Run on stores with a clock of
//! their own (database servers), as production runs them. (The processes whose whole
//! clock is skewed, under libfaketime, are `tests/skew.rs`.)

use std::time::{Duration, SystemTime};

use idem::store::{Claim, ClaimOutcome, FenceCheck};
use idem::{IdempotencyStore, Status};

use super::calls::Store;
use super::unique;

const AHEAD: Duration = Duration::from_secs(5 * 60);

fn claim_at<'a>(key: &'a str, now: SystemTime, lease: Duration, ttl: Duration) -> Claim<'a> {
    Claim::new("clock", key, now, lease, ttl)
}

fn granted(outcome: ClaimOutcome) -> idem::store::Lease {
    match outcome {
        ClaimOutcome::Acquired(lease) => lease,
        ClaimOutcome::Existing(record) => panic!("refused: {record:?}"),
    }
}

/// The reproduction: a call holds its key for 4 s; a caller whose clock runs 5 minutes
/// ahead claims it 1 s later. The store's clock says the lease runs: refused, the
/// running claim answered; the holder's completion still lands.
pub async fn a_caller_ahead_does_not_take_over_a_running_claim(store: &Store) {
    let key = unique("ahead");
    let lease = granted(
        store
            .claim(&claim_at(
                &key,
                idem::store::now(),
                Duration::from_secs(4),
                Duration::from_secs(60),
            ))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ahead = idem::store::now() + AHEAD;
    match store
        .claim(&claim_at(&key, ahead, Duration::from_secs(4), Duration::from_secs(60)))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(record) => {
            assert_eq!(record.status, Status::Processing);
            assert_eq!(record.fence, lease.fence, "the running claim stands");
        }
        ClaimOutcome::Acquired(taken) => panic!("a caller 5 minutes ahead took over a running claim: {taken:?}"),
    }
    // Its purge cannot cut the holder short either (other tests' records may go).
    store.purge_expired(ahead + AHEAD, 1000).await.unwrap();
    assert!(
        store.get("clock", &key).await.unwrap().is_some(),
        "the running claim is not purged"
    );
    let done = store
        .complete(&lease, "1", ahead, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(done, FenceCheck::Held, "the holder's completion lands");
}

/// A caller whose clock runs 5 minutes behind still takes over a lease that lapsed by
/// the store's clock, and its own lease is counted from the store's instant (not 5
/// minutes in the past, where it would be lapsed at once).
pub async fn a_caller_behind_takes_over_a_lapsed_lease_and_holds_its_own(store: &Store) {
    let key = unique("behind");
    let short = Duration::from_millis(300);
    let first = granted(
        store
            .claim(&claim_at(&key, idem::store::now(), short, Duration::from_secs(60)))
            .await
            .unwrap(),
    );
    tokio::time::sleep(short * 3).await;
    let behind = idem::store::now() - AHEAD;
    let second = granted(
        store
            .claim(&claim_at(
                &key,
                behind,
                Duration::from_secs(30),
                Duration::from_secs(60),
            ))
            .await
            .unwrap(),
    );
    assert!(second.fence > first.fence, "a takeover: {first:?} then {second:?}");
    // A third caller, on time, finds the new lease running.
    match store
        .claim(&claim_at(&key, idem::store::now(), short, Duration::from_secs(60)))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(record) => {
            assert_eq!(record.fence, second.fence);
            let until = record.lease_until.expect("a running claim has a lease");
            let from_now = until.duration_since(SystemTime::now()).unwrap_or_default();
            assert!(
                from_now > Duration::from_secs(25),
                "the lease runs from the store's instant: {from_now:?} left"
            );
        }
        ClaimOutcome::Acquired(taken) => panic!("the behind caller's lease was lapsed at once: {taken:?}"),
    }
    // Its renewal, from 5 minutes behind, still extends from the store's instant.
    assert_eq!(
        store.renew(&second, behind, Duration::from_secs(30)).await.unwrap(),
        FenceCheck::Held
    );
    let record = store.get("clock", &key).await.unwrap().unwrap();
    let left = record
        .lease_until
        .unwrap()
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(
        left > Duration::from_secs(25),
        "renewed from the store's instant: {left:?} left"
    );
}

/// Expiry counts from the store's completion, whatever instant the holder passes; a
/// caller ahead of the store does not see the record as expired, nor purge it.
pub async fn expiry_counts_from_the_stores_completion(store: &Store) {
    let key = unique("expiry");
    let ttl = Duration::from_secs(60);
    let behind = idem::store::now() - AHEAD;
    let lease = granted(
        store
            .claim(&claim_at(&key, behind, Duration::from_secs(5), ttl))
            .await
            .unwrap(),
    );
    let written = store.complete(&lease, "7", behind, ttl).await.unwrap();
    assert_eq!(written, FenceCheck::Held);
    let record = store.get("clock", &key).await.unwrap().unwrap();
    let completed = record.completed_at.expect("completed");
    let off = completed
        .duration_since(SystemTime::now())
        .or_else(|_| SystemTime::now().duration_since(completed))
        .unwrap();
    assert!(
        off < Duration::from_secs(30),
        "completed at the store's instant, {off:?} from this host's"
    );
    assert_eq!(record.expires_at.duration_since(completed).unwrap(), ttl, "{record:?}");
    let ahead = idem::store::now() + AHEAD;
    store.purge_expired(ahead, 1000).await.unwrap();
    assert!(
        store.get("clock", &key).await.unwrap().is_some(),
        "not expired by the store's clock, not purged"
    );
    match store
        .claim(&claim_at(&key, ahead, Duration::from_secs(5), ttl))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(record) => assert_eq!(record.status, Status::Succeeded),
        ClaimOutcome::Acquired(lease) => panic!("a caller ahead re-ran a live record: {lease:?}"),
    }
}

/// A fresh record's fence is its `created_at` in microseconds, both the store's.
pub async fn a_new_records_fence_is_its_stores_instant(store: &Store) {
    let key = unique("fence");
    let behind = idem::store::now() - AHEAD;
    let lease = granted(
        store
            .claim(&claim_at(&key, behind, Duration::from_secs(5), Duration::from_secs(60)))
            .await
            .unwrap(),
    );
    assert_eq!(
        lease.fence,
        super::first_fence(&store.get("clock", &key).await.unwrap().unwrap())
    );
    assert!(!lease.took_over());
    let off = SystemTime::now().duration_since(lease.created_at).unwrap_or_default();
    assert!(
        off < Duration::from_secs(30),
        "created at the store's instant, not 5 minutes back"
    );
}

/// Generate the store-clock tests on a store from `$store` (an `Option`).
#[macro_export]
macro_rules! store_clock_suite {
    ($store:expr) => {
        $crate::conformance_suite!(@tests $store; clock;
            a_caller_ahead_does_not_take_over_a_running_claim,
            a_caller_behind_takes_over_a_lapsed_lease_and_holds_its_own,
            expiry_counts_from_the_stores_completion,
            a_new_records_fence_is_its_stores_instant,
        );
    };
}
