//! The cache tier: the conformance suite through `CachedStore`, and what the cache
//! itself promises — replays without the store, never PROCESSING, never a record of
//! another payload, never past `expires_at`.

use idem_testkit::conformance;
use idem_testkit::conformance_suite;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, CachedStore, IdempotencyStore, MemoryStore, SqliteStore};

// The scenarios claim at instants of their own: the memory store behind the cache judges
// by them.
conformance_suite!(async {
    let memory = MemoryStore::new().with_lease_clock(idem::LeaseClock::Caller);
    Some(Arc::new(CachedStore::new(memory, 10_000)) as Arc<dyn IdempotencyStore>)
});

type Cached = Arc<CachedStore<SqliteStore>>;

/// Records kept for `ttl`, which the expiry test makes short and the others long (so
/// that a slow machine never sees a record expire between a call and its duplicate).
#[idempotent(key = key, biz = "cached", store = store, payload = amount, ttl = ttl)]
async fn pay_for(store: &Cached, key: &str, amount: u32, runs: &AtomicU32, ttl: Duration) -> Result<u32, idem::Error> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(amount)
}

async fn pay(store: &Cached, key: &str, amount: u32, runs: &AtomicU32) -> Result<u32, idem::Error> {
    pay_for(store, key, amount, runs, Duration::from_secs(3600)).await
}

async fn cached_sqlite() -> Cached {
    let path = idem_testkit::scratch::path("cached.db");
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    Arc::new(CachedStore::new(store, 100))
}

async fn delete_rows(store: &Cached, key: &str) {
    idem::sqlx::query("DELETE FROM idempotent_record WHERE idempotent_key = ?")
        .bind(key)
        .execute(store.inner().pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn replays_from_the_cache_and_only_finished_records_of_the_same_payload() {
    let store = cached_sqlite().await;
    let key = conformance::unique("hot");
    let runs = AtomicU32::new(0);

    let first = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { pay(&store, &key, 199, &AtomicU32::new(0)).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(matches!(
        pay(&store, &key, 199, &runs).await,
        Err(idem::Error::InProgress { .. })
    ));
    assert_eq!(store.cached(), 0, "a PROCESSING record is never cached");
    assert_eq!(first.await.unwrap().unwrap(), 199);

    assert_eq!(
        pay(&store, &key, 199, &runs).await.unwrap(),
        199,
        "the first duplicate reads the store"
    );
    assert_eq!(store.cached(), 1);
    delete_rows(&store, &key).await;
    assert_eq!(
        pay(&store, &key, 199, &runs).await.unwrap(),
        199,
        "later ones are served from the cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Another payload is never answered from the cache: it reaches the store, where
    // the row is gone, so the body runs.
    assert_eq!(pay(&store, &key, 500, &runs).await.unwrap(), 500);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_mismatching_record_is_not_cached() {
    let store = cached_sqlite().await;
    let key = conformance::unique("mismatch");
    let runs = AtomicU32::new(0);
    // The first call through another process's cache (one over the same table).
    let elsewhere: Cached = Arc::new(CachedStore::new(store.inner().clone(), 100));
    pay(&elsewhere, &key, 199, &runs).await.unwrap();
    assert!(matches!(
        pay(&store, &key, 500, &runs).await,
        Err(idem::Error::PayloadMismatch { .. })
    ));
    assert_eq!(
        store.cached(),
        0,
        "the record that failed payload validation is not cached"
    );
}

#[tokio::test]
async fn a_call_through_the_cache_caches_the_record_it_wrote() {
    let store = cached_sqlite().await;
    let key = conformance::unique("own");
    let runs = AtomicU32::new(0);
    assert_eq!(pay(&store, &key, 199, &runs).await.unwrap(), 199);
    assert_eq!(store.cached(), 1, "cached as it was written");
    delete_rows(&store, &key).await;
    assert_eq!(
        pay(&store, &key, 199, &runs).await.unwrap(),
        199,
        "its duplicate is answered by the cache"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn cached_records_expire_with_their_ttl() {
    let store = cached_sqlite().await;
    let key = conformance::unique("ttl");
    let runs = AtomicU32::new(0);
    let ttl = Duration::from_secs(2);
    pay_for(&store, &key, 199, &runs, ttl).await.unwrap();
    pay_for(&store, &key, 199, &runs, ttl).await.unwrap();
    assert_eq!(store.cached(), 1);
    let first = store.inner().get("cached", &key).await.unwrap().unwrap();
    tokio::time::sleep(ttl + Duration::from_millis(500)).await;
    assert_eq!(pay_for(&store, &key, 199, &runs, ttl).await.unwrap(), 199);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "after its ttl the key runs again, cache or not"
    );
    let record = store.inner().get("cached", &key).await.unwrap().unwrap();
    assert!(record.fence > first.fence, "re-claimed after expiry: a higher fence");
    assert!(record.created_at > first.created_at, "in a new life");
    assert_eq!(
        record.fence,
        conformance::first_fence(&record),
        "which starts at its first instant"
    );
}

#[tokio::test]
async fn the_cache_is_bounded() {
    let store = Arc::new(CachedStore::new(MemoryStore::new(), 50));
    for i in 0..500 {
        let key = format!("k{i}");
        let op = idem::Idempotent::new("bounded").store(store.clone());
        op.execute(&key, async { Ok::<_, idem::Error>(i) }).await.unwrap();
        op.execute(&key, async { Ok::<_, idem::Error>(i) }).await.unwrap();
    }
    assert!(store.cached() <= 50, "{} cached", store.cached());
}

/// A holder whose claim was taken over writes nothing, and the cache keeps nothing of
/// that refused write: the next duplicate gets the new holder's answer.
#[tokio::test]
async fn a_refused_write_is_not_cached() {
    use idem::store::{Claim, ClaimOutcome, FenceCheck};
    let store = cached_sqlite().await;
    let key = conformance::unique("stale");
    let now = idem::store::now();
    let (lease, ttl) = (Duration::from_secs(1), Duration::from_secs(60));
    let ClaimOutcome::Acquired(stale) = store.claim(&Claim::new("cached", &key, now, lease, ttl)).await.unwrap() else {
        panic!("first claim")
    };
    let later = now + Duration::from_secs(2);
    let ClaimOutcome::Acquired(new) = store
        .claim(&Claim::new("cached", &key, later, lease, ttl))
        .await
        .unwrap()
    else {
        panic!("takeover")
    };
    assert_eq!(
        store.complete(&stale, "\"stale\"", later, ttl).await.unwrap(),
        FenceCheck::Lost
    );
    assert_eq!(store.cached(), 0, "nothing cached of a refused write");
    assert_eq!(
        store.complete(&new, "\"new\"", later, ttl).await.unwrap(),
        FenceCheck::Held
    );
    assert_eq!(store.cached(), 1, "the new holder's record is cached as it was written");
    delete_rows(&store, &key).await;
    match store
        .claim(&Claim::new("cached", &key, later, lease, ttl))
        .await
        .unwrap()
    {
        ClaimOutcome::Existing(record) => assert_eq!(record.response_body.as_deref(), Some("\"new\"")),
        other => panic!("{other:?}"),
    }

    // A write the store refused for its own holder (its record gone) is not cached.
    let gone = conformance::unique("gone");
    let ClaimOutcome::Acquired(holder) = store
        .claim(&Claim::new("cached", &gone, now, lease, ttl))
        .await
        .unwrap()
    else {
        panic!("claim")
    };
    delete_rows(&store, &gone).await;
    assert_eq!(
        store.complete(&holder, "\"lost\"", now, ttl).await.unwrap(),
        FenceCheck::Lost
    );
    assert_eq!(store.cached(), 1, "nothing more cached");
}

/// An operator deletes a FAIL record in the store (`idem retry-failed`): the next call
/// through the cache runs, instead of being answered `PreviousFailed` by a copy.
#[tokio::test]
async fn retry_failed_in_the_store_takes_effect_through_the_cache() {
    let store = cached_sqlite().await;
    let shared: conformance::calls::Store = store.clone();
    conformance::database::retry_failed_takes_effect_through_a_tier(&shared, |biz, key| {
        let store = store.clone();
        async move { store.inner().forget_failed(biz, &key).await.unwrap() }
    })
    .await;
}
