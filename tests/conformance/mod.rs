//! One conformance suite, run against every store: each scenario goes through the
//! `#[idempotent]` attribute (and, where a scenario is about the store itself, the store
//! trait), with the same assertions on every backend.
//!
//! A backend file calls `conformance_suite!(async { Arc<dyn IdempotencyStore> })`.

#![allow(dead_code)]

pub mod calls;
pub mod scenarios;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A key no earlier run or other test used, so suites can share a database.
pub fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Generate one `#[tokio::test]` per scenario, each on a store from `$store`.
#[macro_export]
macro_rules! conformance_suite {
    ($store:expr) => {
        $crate::conformance_suite!(@tests $store;
            first_call_runs_once_and_records_success,
            repeat_replays_without_running,
            reject_mode_refuses_duplicates,
            concurrent_duplicates_run_once,
            concurrent_duplicates_with_wait_all_get_the_first_result,
            duplicate_in_progress_gets_in_progress,
            wait_returns_the_first_result,
            payload_mismatch_is_refused_and_record_untouched,
            identical_payload_replays,
            on_error_release_lets_a_retry_run,
            on_error_record_answers_previous_failed,
            expired_record_runs_again,
            cancelled_holder_is_taken_over_after_its_lease,
            panicking_body_leaves_the_claim_to_its_lease,
            live_holder_keeps_its_claim_past_one_lease,
            stale_holder_cannot_complete_over_the_new_holder,
            stale_holder_cannot_fail_or_release_the_new_record,
            bad_keys_are_refused_before_the_body,
            falsy_looking_keys_are_valid,
            biz_namespaces_do_not_share_records,
            typed_results_round_trip_exactly,
            two_functions_keep_their_own_options,
            context_names_the_claim,
            success_is_never_taken_over_before_its_ttl,
            rejected_duplicate_deletes_nothing,
            undecodable_response_is_a_decode_error_and_kept,
            purge_deletes_only_expired_records_in_batches,
        );
    };
    (@tests $store:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let store: std::sync::Arc<dyn idem::IdempotencyStore> = $store.await;
                $crate::conformance::scenarios::$scenario(&store).await;
            }
        )*
    };
}
