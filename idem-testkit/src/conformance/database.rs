//! Scenarios only a database store has: several pools on one database, restarts,
//! rows edited by hand, a server that cannot be reached.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem::store::{Claim, ClaimOutcome};
use idem::{Error, Status};

use super::calls::*;
use super::unique;

/// Two stores (two pools) on one database see one record.
pub async fn two_stores_see_one_record(a: &Store, b: &Store) {
    let key = unique("two-stores");
    let runs = Runs::default();
    let receipt = pay(a, &key, &runs, Duration::ZERO).await.unwrap();
    assert_eq!(
        pay(b, &key, &runs, Duration::ZERO).await.unwrap(),
        receipt,
        "replayed through the other pool"
    );
    assert_eq!(
        a.get("conformance.pay", &key).await.unwrap(),
        b.get("conformance.pay", &key).await.unwrap()
    );
    assert_eq!(runs.count(), 1);
}

/// Claimants on two pools race to take over lapsed claims: one winner per key.
pub async fn takeover_race_has_one_winner(a: &Store, b: &Store) {
    let biz = unique("race");
    let now = idem::store::now();
    let hour = Duration::from_secs(3600);
    for i in 0..20 {
        let key = format!("k{i}");
        let stale = Claim::new(&biz, &key, now - hour, Duration::from_secs(1), 2 * hour);
        assert!(matches!(a.claim(&stale).await.unwrap(), ClaimOutcome::Acquired(_)));
        let claim = Claim::new(&biz, &key, now, Duration::from_secs(30), hour);
        let (first, second) = tokio::join!(a.claim(&claim), b.claim(&claim));
        let outcomes = [first.unwrap(), second.unwrap()];
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                ClaimOutcome::Acquired(lease) => Some(lease.fence),
                ClaimOutcome::Existing(record) => {
                    assert_eq!(
                        (record.status, record.fence),
                        (Status::Processing, super::first_fence(record) + 1)
                    );
                    None
                }
            })
            .collect();
        let taken = stale.first_fence() + 1;
        assert_eq!(
            winners,
            vec![taken],
            "exactly one takeover of {key}, with the next fence"
        );
    }
}

/// A record written before a restart (a new pool on the same database) is replayed.
pub async fn record_survives_a_restart<F, Fut>(open: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Store>,
{
    let key = unique("restart");
    let runs = Runs::default();
    let before = {
        let store = open().await;
        pay(&store, &key, &runs, Duration::ZERO).await.unwrap()
    };
    let store = open().await;
    assert_eq!(pay(&store, &key, &runs, Duration::ZERO).await.unwrap(), before);
    assert_eq!(runs.count(), 1);
}

/// A `response_body` edited by hand into something that is not the type: `Decode`
/// naming biz and key, and the row stays.
pub async fn corrupted_response_is_a_decode_error<F, Fut>(store: &Store, corrupt: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let key = unique("corrupt");
    let runs = Runs::default();
    pay(store, &key, &runs, Duration::ZERO).await.unwrap();
    corrupt(key.clone()).await;
    let before = store.get("conformance.pay", &key).await.unwrap().expect("the row");
    let error = pay(store, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    match &error {
        Error::Decode { biz, key: k, .. } => {
            assert_eq!((biz.as_str(), k), ("conformance.pay", &key))
        }
        other => panic!("expected Decode, got {other:?}"),
    }
    let message = error.to_string();
    assert!(
        message.contains("conformance.pay") && message.contains(&key),
        "{message}"
    );
    assert_eq!(
        store.get("conformance.pay", &key).await.unwrap(),
        Some(before),
        "nothing deleted"
    );
    assert_eq!(runs.count(), 1);
}

/// A database that cannot be reached: `Error::Store`, and the body does not run.
pub async fn unreachable_database_fails_closed(store: &Store) {
    let runs = Arc::new(Runs::default());
    let error = pay(store, "any", &runs, Duration::ZERO).await.unwrap_err().idem();
    assert!(matches!(&error, Error::Store { operation: "claim", .. }), "{error:?}");
    assert!(std::error::Error::source(&error).is_some(), "the cause is kept");
    let said = super::chain(&error).to_lowercase();
    assert!(
        said.contains("connection refused") || said.contains("unable to open database file"),
        "the driver's cause (of a pool's time-out, too) is in the chain: {said}"
    );
    assert_eq!(runs.count(), 0, "fail closed: the body did not run");
}

/// Leave a PROCESSING claim made two hours ago and a FAIL record; return their keys.
pub async fn stuck_and_failed(store: &Store) -> (String, String) {
    let stuck = unique("stuck");
    let two_hours_ago = idem::store::now() - Duration::from_secs(7200);
    let claim = Claim::new(
        "conformance.stuck",
        &stuck,
        two_hours_ago,
        Duration::from_secs(10),
        Duration::from_secs(86_400),
    );
    assert!(matches!(store.claim(&claim).await.unwrap(), ClaimOutcome::Acquired(_)));
    let failed = unique("failed");
    let runs = Runs::default();
    assert!(flaky_record(store, &failed, &runs, true).await.is_err());
    (stuck, failed)
}

/// With the row the purge guard is for: expired, yet PROCESSING under a
/// lease that still runs (written by hand — the executor never leaves one).
pub async fn purge_never_deletes_a_running_claim<F, Fut>(store: &Store, edit: F)
where
    F: Fn(&'static str, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let biz = unique("purge-guard");
    let now = idem::store::now();
    let hour = Duration::from_secs(3600);
    granted(store, &biz, "running", now, hour, hour).await;
    edit("expires_at = created_at", "running".to_owned()).await;
    granted(store, &biz, "lapsed", now - 3 * hour, hour, Duration::from_secs(1)).await;
    let record = store.get(&biz, "running").await.unwrap().unwrap();
    assert!(record.is_expired(now) && !record.lease_lapsed(now), "{record:?}");
    while store.purge_expired(now, 1000).await.unwrap() > 0 {}
    assert_eq!(
        store.get(&biz, "lapsed").await.unwrap(),
        None,
        "an expired, lapsed claim goes"
    );
    assert_eq!(
        store.get(&biz, "running").await.unwrap().map(|record| record.status),
        Some(Status::Processing),
        "a claim whose lease still runs stays, expired or not"
    );
}

/// A PROCESSING record whose lease is missing is never treated as free.
pub async fn processing_without_a_lease_is_never_free<F, Fut>(store: &Store, edit: F)
where
    F: Fn(&'static str, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let key = unique("no-lease");
    let hour = Duration::from_secs(3600);
    granted(
        store,
        "conformance.pay",
        &key,
        idem::store::now() - hour,
        Duration::from_secs(1),
        2 * hour,
    )
    .await;
    edit("lease_until = NULL", key.clone()).await;
    let runs = Runs::default();
    let error = pay(store, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    let error = pay_waiting_briefly(store, &key, &runs).await.unwrap_err().idem();
    assert!(
        matches!(error, Error::InProgress { .. }),
        "a waiter does not take it either: {error:?}"
    );
    assert_eq!(runs.count(), 0);
}

/// An expired PROCESSING record without a lease is never purged: nothing says its
/// holder is gone (the SQL purges and the Redis purge alike).
pub async fn purge_keeps_an_expired_claim_without_a_lease<F, Fut>(store: &Store, edit: F)
where
    F: Fn(&'static str, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let key = unique("no-lease-purge");
    let hour = Duration::from_secs(3600);
    // Claimed under a lease that runs (no purge may take it meanwhile), then made
    // lease-less and expired in one edit.
    granted(store, "conformance.pay", &key, idem::store::now(), hour, hour).await;
    edit("lease_until = NULL, expires_at = created_at", key.clone()).await;
    let now = idem::store::now();
    // Until nothing is left to purge; a batch a cluster rolls back (another test's
    // write to the table) is tried again.
    let mut rolled_back = 0;
    loop {
        match store.purge_expired(now, 1000).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) if rolled_back < 10 => {
                rolled_back += 1;
                eprintln!("purge batch failed ({error}); again");
            }
            Err(error) => panic!("{error}"),
        }
    }
    let kept = store.get("conformance.pay", &key).await.unwrap();
    assert!(
        kept.as_ref()
            .is_some_and(|r| r.lease_until.is_none() && r.is_expired(now)),
        "{kept:?}"
    );
}

/// An expired PROCESSING record without a lease is claimed again like any expired
/// record, and the new claim has a lease.
pub async fn expired_claim_without_a_lease_is_claimed_with_one<F, Fut>(store: &Store, edit: F)
where
    F: Fn(&'static str, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let (biz, key) = (unique("expired-no-lease"), unique("k"));
    let now = idem::store::now();
    let hour = Duration::from_secs(3600);
    granted(
        store,
        &biz,
        &key,
        now - 3 * hour,
        Duration::from_secs(1),
        Duration::from_secs(1),
    )
    .await;
    edit("lease_until = NULL", key.clone()).await;
    granted(store, &biz, &key, now, Duration::from_secs(30), hour).await;
    let record = store.get(&biz, &key).await.unwrap().unwrap();
    assert_eq!(record.lease_until, Some(now + Duration::from_secs(30)), "{record:?}");
    assert_eq!(record.created_at, now, "a new life");
}

/// Fails until `ok` is set, with `on_error = Record`.
#[idem::idempotent(key = key, biz = "tiers.flaky", store = store, on_error = Record)]
async fn flaky(store: &Store, key: &str, ok: bool, runs: &Runs) -> Result<u32, AppError> {
    let n = runs.hit();
    if ok {
        Ok(n)
    } else {
        Err(AppError::Declined("the bank said no".into()))
    }
}

/// An operator deletes a FAIL record in the store that decides (`forget`, what `idem
/// retry-failed` does): the next call through `store` — a tier in front of it — runs,
/// instead of being answered `PreviousFailed` by a copy.
pub async fn retry_failed_takes_effect_through_a_tier<F, Fut>(store: &Store, forget: F)
where
    F: Fn(&'static str, String) -> Fut,
    Fut: Future<Output = bool>,
{
    let key = unique("retry-failed");
    let runs = Runs::default();
    assert!(flaky(store, &key, false, &runs).await.is_err());
    for _ in 0..2 {
        let again = flaky(store, &key, true, &runs).await.unwrap_err().idem();
        assert!(matches!(again, Error::PreviousFailed { .. }), "{again:?}");
    }
    assert!(forget("tiers.flaky", key.clone()).await, "the FAIL record was deleted");
    assert_eq!(flaky(store, &key, true, &runs).await.unwrap(), 2, "the next call ran");
    assert_eq!(runs.count(), 2);
}
