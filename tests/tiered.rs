//! Redis in front of SQLite (`TieredStore`): the conformance suite unchanged, and the
//! pre-check's promises — duplicates of finished calls answered from Redis, the SQL
//! claim the only decision, a Redis that forgets or fails costing round trips only.

use idem_testkit::conformance;
use idem_testkit::conformance_suite;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{idempotent, IdempotencyStore, RedisStore, SqliteStore, TieredStore};

type Tiered = Arc<TieredStore<RedisStore, SqliteStore>>;

async fn open() -> Option<Tiered> {
    let url = conformance::server_url("IDEM_TEST_REDIS_URL", "Redis")?;
    let front = RedisStore::connect(&url).await.expect("connect to Redis");
    let path = idem_testkit::scratch::path("tiered.db");
    let back = SqliteStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    back.migrate().await.unwrap();
    Some(Arc::new(TieredStore::new(front, back)))
}

conformance_suite!(async { open().await.map(|store| store as Arc<dyn IdempotencyStore>) });

#[idempotent(key = key, biz = "tiered", store = store, payload = amount)]
async fn pay(store: &Tiered, key: &str, amount: u32, runs: &AtomicU32) -> Result<u32, idem::Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(amount)
}

#[tokio::test]
async fn finished_duplicates_are_answered_by_the_front() {
    let Some(store) = open().await else { return };
    let key = conformance::unique("hot");
    let runs = AtomicU32::new(0);
    assert_eq!(pay(&store, &key, 199, &runs).await.unwrap(), 199);
    assert!(
        store.front().get("tiered", &key).await.unwrap().is_none(),
        "not copied before a duplicate"
    );
    assert_eq!(
        pay(&store, &key, 199, &runs).await.unwrap(),
        199,
        "the first duplicate asks SQLite"
    );
    let copy = store
        .front()
        .get("tiered", &key)
        .await
        .unwrap()
        .expect("copied to Redis");
    let row = store.back().get("tiered", &key).await.unwrap().unwrap();
    assert_eq!(
        (copy.response_body, copy.fingerprint),
        (row.response_body, row.fingerprint)
    );
    // The row gone from SQLite: Redis still answers the duplicate.
    idem::sqlx::query("DELETE FROM idempotent_record WHERE idempotent_key = ?")
        .bind(&key)
        .execute(store.back().pool())
        .await
        .unwrap();
    assert_eq!(pay(&store, &key, 199, &runs).await.unwrap(), 199);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Another payload is never answered by the front: it reaches SQLite, which decides.
    assert_eq!(pay(&store, &key, 500, &runs).await.unwrap(), 500);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_front_that_forgets_costs_a_round_trip_not_a_run() {
    let Some(store) = open().await else { return };
    let key = conformance::unique("forget");
    let runs = AtomicU32::new(0);
    pay(&store, &key, 199, &runs).await.unwrap();
    pay(&store, &key, 199, &runs).await.unwrap();
    // Redis restarts empty (as without persistence): SQLite still has the record.
    let url = std::env::var("IDEM_TEST_REDIS_URL").unwrap();
    let mut conn = idem::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = idem::redis::cmd("DEL")
        .arg(store.front().record_key("tiered", &key))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pay(&store, &key, 199, &runs).await.unwrap(), 199);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never a second run");
}

/// An operator deletes a FAIL record in the store that decides (`idem retry-failed` on
/// SQLite): the next call runs, whatever Redis in front held.
#[tokio::test]
async fn retry_failed_in_the_back_takes_effect_through_the_front() {
    let Some(store) = open().await else { return };
    let shared: conformance::calls::Store = store.clone();
    conformance::database::retry_failed_takes_effect_through_a_tier(&shared, |biz, key| {
        let store = store.clone();
        async move { store.back().forget_failed(biz, &key).await.unwrap() }
    })
    .await;
}
