//! The kit fails broken stores: every scenario of the conformance suite runs against a
//! correct store (none may fail) and against each mutant of it (at least one must), so
//! a store that would run a body twice or lose a record cannot be certified.

use std::sync::Arc;
use std::time::Duration;

use idem_testkit::conformance::{self, calls::Store};
use idem_testkit::mutants::{Bug, MutantStore};

/// How many scenarios run at once: some scenarios time their calls (a call cancelled
/// after 100 ms mid-body), and a machine running all of them at once misses those
/// times.
const AT_ONCE: usize = 4;

/// The scenarios that failed (panicked, or hung past 15 s) on `store`.
async fn failures(store: &MutantStore) -> Vec<&'static str> {
    use futures::StreamExt;
    let shared: Store = Arc::new(store.clone());
    let outcomes: Vec<(&'static str, bool)> = futures::stream::iter(conformance::all())
        .map(|scenario| {
            let store = shared.clone();
            async move {
                let run = tokio::spawn(tokio::time::timeout(Duration::from_secs(15), (scenario.run)(store)));
                (scenario.name, matches!(run.await, Ok(Ok(()))))
            }
        })
        .buffer_unordered(AT_ONCE)
        .collect()
        .await;
    let mut failed: Vec<&'static str> = outcomes
        .into_iter()
        .filter(|(_, passed)| !passed)
        .map(|(name, _)| name)
        .collect();
    failed.sort_unstable();
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_correct_store_passes_every_scenario() {
    let failed = failures(&MutantStore::new(None)).await;
    assert!(failed.is_empty(), "the correct store failed {failed:?}");
    assert!(conformance::all().len() >= 59, "{} scenarios", conformance::all().len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_mutant_store_fails_the_kit() {
    let mut survivors = Vec::new();
    for bug in Bug::ALL {
        let failed = failures(&MutantStore::new(Some(bug))).await;
        eprintln!("mutant {bug:?}: failed {} scenarios {failed:?}", failed.len());
        if failed.is_empty() {
            survivors.push(bug);
        }
    }
    assert!(survivors.is_empty(), "the kit certified broken stores: {survivors:?}");
}
