//! The conformance suite on [`idem::MemoryStore`].

use idem_testkit::conformance_suite;

use std::sync::Arc;

// The scenarios claim at instants of their own (an hour ago, a minute ahead): the
// store judges by them, as SQLite does; its default steady clock is tested beside it.
fn store() -> idem::MemoryStore {
    idem::MemoryStore::new().with_lease_clock(idem::LeaseClock::Caller)
}

conformance_suite!(async { Some(Arc::new(store()) as Arc<dyn idem::IdempotencyStore>) });

#[tokio::test]
async fn the_sweeper_purges_in_the_background() {
    use idem::store::{Claim, ClaimOutcome};
    use idem::{IdempotencyStore, Sweeper};
    use std::time::Duration;

    let store = Arc::new(store());
    let long_ago = idem::store::now() - Duration::from_secs(3600);
    for i in 0..2500 {
        let key = format!("k{i}");
        let claim = Claim::new("sweep", &key, long_ago, Duration::from_secs(1), Duration::from_secs(60));
        assert!(matches!(store.claim(&claim).await.unwrap(), ClaimOutcome::Acquired(_)));
    }
    let live = Claim::new(
        "sweep",
        "live",
        idem::store::now(),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    assert!(matches!(store.claim(&live).await.unwrap(), ClaimOutcome::Acquired(_)));
    let sweeper = store.clone().continuously_purge(Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(300)).await;
    sweeper.abort();
    assert_eq!(
        store.len(),
        1,
        "2,500 expired records purged over several batches, the live one kept"
    );
    assert!(store.get("sweep", "live").await.unwrap().is_some());
}
