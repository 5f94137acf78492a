//! The failover storm's check fails a store that runs a body twice, and says how: the
//! doubled key's attempts, caller by caller. On a correct store it passes.

use std::time::Duration;

use futures::FutureExt;
use idem_testkit::harness::failover::Storm;
use idem_testkit::mutants::{Bug, MutantStore};

/// A storm of 4 workers × 40 keys on `store` (each on a handle of its own, so their
/// claims of a key meet at the store as separate processes' do), then its check: the
/// panic's message, if the check failed.
async fn storm_on(store: MutantStore) -> Option<String> {
    let (storm, handles) = Storm::start_apart(&store, 4, 40, |handle| {
        idem::Idempotent::new("storm")
            .store(handle)
            .lease(Duration::from_secs(60))
    });
    Storm::join(handles, Duration::from_secs(60)).await;
    let checked = std::panic::AssertUnwindSafe(storm.check(4, 40, "storm", &store))
        .catch_unwind()
        .await;
    checked.err().map(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_run_twice_fails_the_check_with_its_attempts() {
    let failed = storm_on(MutantStore::new(Some(Bug::NonAtomicClaim)))
        .await
        .expect("a store that grants one key twice passed the storm's check");
    assert!(failed.contains("times"), "{failed}");
    // Both callers of the doubled key are told, each with what its call came to.
    assert!(failed.contains("its attempts:"), "{failed}");
    assert!(failed.matches("(1×): answered").count() >= 2, "{failed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_correct_store_passes_the_check() {
    assert_eq!(storm_on(MutantStore::new(None)).await, None);
}

/// A store whose clones are one store (an `Arc` of it) would give every worker one claim
/// gate, and the storm would put nothing to the store's own claim: refused.
#[tokio::test]
#[should_panic(expected = "the clones of the store are one store")]
async fn a_store_whose_clones_are_one_store_is_refused() {
    let store: std::sync::Arc<dyn idem::IdempotencyStore> = std::sync::Arc::new(idem::MemoryStore::new());
    let _ = Storm::start_apart(&store, 2, 1, |handle| idem::Idempotent::new("storm").store(handle));
}
