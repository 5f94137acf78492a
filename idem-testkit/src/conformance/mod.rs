//! One conformance suite, run against every store: each scenario goes through the
//! `#[idempotent]` attribute (and, where a scenario is about the store itself, the store
//! trait), with the same assertions on every backend.
//!
//! A backend file calls `conformance_suite!(async { Option<Arc<dyn IdempotencyStore>> })`,
//! and a database backend `database_suite!()` as well.

pub mod calls;
pub mod faulty;
// The scenarios themselves: what the suites' macros call, not API of their own.
#[doc(hidden)]
pub mod clock;
#[doc(hidden)]
pub mod database;
#[doc(hidden)]
pub mod injected;
#[doc(hidden)]
pub mod notices;
#[doc(hidden)]
pub mod retention;
#[doc(hidden)]
pub mod round_trips;
#[doc(hidden)]
pub mod scenarios;
#[doc(hidden)]
pub mod steps;
#[doc(hidden)]
pub mod tokens;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A key no earlier run or other test used, so suites can share a database.
pub fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!(
        "{name}-{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// An error and every cause under it, `: `-joined, as an error reporter prints them.
pub use idem::error_chain as chain;

/// Wait until `reached` answers true, asked every 5 ms for at most 20 s, however loaded
/// the machine; panics naming `what` if it never does.
pub async fn until<Asked>(what: &str, mut reached: impl FnMut() -> Asked)
where
    Asked: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !reached().await {
        assert!(std::time::Instant::now() < deadline, "{what} never happened");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Drive `call` until `reached` is done (e.g. [`until`] the call has claimed its key),
/// then drop it mid-way, as a caller that gives up does. However loaded the machine, the
/// call is dropped past that point and before it ends (it must not end first).
pub async fn dropped_once<T>(
    call: impl std::future::Future<Output = T>,
    reached: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        biased;
        () = reached => {}
        _ = call => panic!("the call ended before it was to be dropped"),
    }
}

/// The fence a record's life began with: its `created_at` in microseconds.
pub fn first_fence(record: &idem::Record) -> u64 {
    record.created_at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

/// The URL of a server the tests may use (a database, a broker), from `var`. Under CI (`CI` set) a
/// missing URL fails the test; elsewhere the backend is skipped, and said so once on
/// stderr (written past the test harness's capture).
pub fn server_url(var: &str, backend: &str) -> Option<String> {
    if let Ok(url) = std::env::var(var) {
        return Some(url);
    }
    if std::env::var_os("CI").is_some() {
        panic!("{var} is not set: CI must run the {backend} suite against a real server (see .ci/run)");
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "NOT RUN: the {backend} suite needs {var} (`.ci/run` starts every server the tests use and sets its URL)"
        );
    });
    None
}

/// Every scenario of [`conformance_suite!`](crate::conformance_suite), by module, handed to the macro `$then`
/// (one of this crate's) after `$($args)*`: the one list the suite's tests and
/// [`all`] are made from.
#[doc(hidden)]
#[macro_export]
macro_rules! __every_scenario {
    ($then:ident; $($args:tt)*) => {
        $crate::$then! {$($args)*;
            injected [
                outcome_is_recorded_after_the_caller_is_dropped,
                failure_outcomes_are_retried,
                late_claim_renews_before_the_body,
                lost_reply_of_a_committed_complete_is_success,
                a_refusal_the_record_contradicts_is_written_again,
                replays_equal_the_first_answer,
                maps_and_sets_replay_as_answered,
                equal_payloads_fingerprint_equal,
                reordered_lists_are_another_payload,
                an_outage_shorter_than_the_lease_runs_a_finished_body_once,
                a_writer_cut_off_past_its_lease_is_taken_over,
                lost_lease_is_signalled_to_the_body,
                waiting_reads_within_its_deadline,
                reentrant_call_fails_at_once,
                durations_are_bounded_by_what_stores_hold,
                store_failures_while_holding_keep_the_key,
                a_response_the_store_keeps_refusing_is_recorded_as_failed,
            ],
            steps [
                takeover_replays_finished_steps,
                released_call_keeps_its_steps,
                failed_step_is_not_recorded,
                step_misuse_is_refused,
                stale_holder_cannot_record_steps,
                a_new_life_starts_without_steps,
                a_step_record_that_fails_once_is_offered_again,
                a_step_does_not_start_once_the_lease_is_lost,
                a_step_value_that_cannot_be_recorded_is_not_run_again,
            ],
            retention [
                a_tombstone_answers_gone_until_its_window_ends,
                without_a_window_an_expired_key_is_a_new_request,
                an_erased_subject_is_answered_erased_and_never_run,
                what_is_not_kept_is_never_replayed_nor_run_again,
            ],
            tokens [
                concurrent_consumers_have_one_winner,
                unknown_tokens_are_refused,
                expired_tokens_are_refused,
            ],
            scenarios [
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
                a_claim_is_kept_for_the_clock_tolerance_past_its_lease,
                live_holder_keeps_its_claim_past_one_lease,
                stale_holder_cannot_complete_over_the_new_holder,
                stale_holder_cannot_fail_or_release_the_new_record,
                stale_lease_writes_nothing_while_the_new_holder_runs,
                lapsed_claim_is_not_taken_over_by_another_payload,
                bad_keys_are_refused_before_the_body,
                falsy_looking_keys_are_valid,
                biz_namespaces_do_not_share_records,
                records_and_leases_carry_their_names,
                typed_results_round_trip_exactly,
                two_functions_keep_their_own_options,
                context_names_the_claim,
                effect_keys_and_fences_follow_the_life_of_a_key,
                success_is_never_taken_over_before_its_ttl,
                rejected_duplicate_deletes_nothing,
                undecodable_response_is_a_decode_error_and_kept,
                purge_deletes_only_expired_records_in_batches,
                a_renewed_claim_outlives_its_ttl,
                a_claim_whose_lease_outlasts_its_ttl_is_kept_while_it_runs,
            ]
        }
    };
}

/// Generate one `#[tokio::test]` per scenario, each on a store from `$store` (an
/// `Option`: `None` when the backend is not available here).
#[macro_export]
macro_rules! conformance_suite {
    ($store:expr) => {
        $crate::__every_scenario!(conformance_suite; @modules $store);
    };
    (@modules $store:expr; $($module:ident [$($scenario:ident),* $(,)?]),* $(,)?) => {
        $( $crate::conformance_suite!(@tests $store; $module; $($scenario),*); )*
    };
    (@tests $store:expr; $module:ident; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let store: Option<std::sync::Arc<dyn idem::IdempotencyStore>> = $store.await;
                if let Some(store) = store {
                    $crate::conformance::$module::$scenario(&store).await;
                }
            }
        )*
    };
}

/// One scenario of the suite: its name (`module::scenario`) and a run of it on a store.
pub struct Scenario {
    /// `module::scenario`, as the suite's test is named.
    pub name: &'static str,
    /// Runs the scenario on a store; it panics where the store falls short.
    pub run: fn(calls::Store) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenario_list {
    (; $($module:ident [$($scenario:ident),* $(,)?]),* $(,)?) => {
        vec![$($(
            $crate::conformance::Scenario {
                name: concat!(stringify!($module), "::", stringify!($scenario)),
                run: |store| Box::pin(async move { $crate::conformance::$module::$scenario(&store).await }),
            },
        )*)*]
    };
}

/// Every scenario of [`conformance_suite!`](crate::conformance_suite), to run by hand: against a store whose
/// verdict is known (a mutant the kit must fail, a correct store it must pass), or to
/// report on a store without a test per scenario.
pub fn all() -> Vec<Scenario> {
    crate::__every_scenario!(__scenario_list;)
}

/// Two stores on one server, as two processes would have: they see one record, and a
/// takeover race between them has one winner. The calling file defines `open_dyn()`.
#[macro_export]
macro_rules! shared_store_suite {
    () => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn two_stores_see_one_record() {
            if let (Some(a), Some(b)) = (open_dyn().await, open_dyn().await) {
                $crate::conformance::database::two_stores_see_one_record(&a, &b).await;
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn takeover_race_has_one_winner() {
            if let (Some(a), Some(b)) = (open_dyn().await, open_dyn().await) {
                $crate::conformance::database::takeover_race_has_one_winner(&a, &b).await;
            }
        }
    };
}

/// Generate the database-only tests. The calling file defines `open()` and
/// `open_dyn()` (a new store on a new pool, concrete or shared; `None` when the
/// server is not available), `edit(set, key)` (`UPDATE … SET {set}` on that record, by
/// hand), `corrupt(key)` (its `response_body` made unreadable) and `unreachable()` (a store whose server cannot be reached).
#[macro_export]
macro_rules! database_suite {
    () => {
        $crate::shared_store_suite!();

        #[tokio::test]
        async fn record_survives_a_restart() {
            if open_dyn().await.is_some() {
                $crate::conformance::database::record_survives_a_restart(|| async { open_dyn().await.unwrap() }).await;
            }
        }

        #[tokio::test]
        async fn corrupted_response_is_a_decode_error() {
            if let Some(store) = open_dyn().await {
                $crate::conformance::database::corrupted_response_is_a_decode_error(&store, corrupt).await;
            }
        }

        #[tokio::test]
        async fn reconciliation_lists_stuck_and_failed_records() {
            let Some(store) = open().await else { return };
            let shared: $crate::conformance::calls::Store = std::sync::Arc::new(store.clone());
            let (stuck, failed) = $crate::conformance::database::stuck_and_failed(&shared).await;
            let old = std::time::Duration::from_secs(3600);
            let listed = store.stuck(None, old, 100_000).await.unwrap();
            assert!(
                listed.iter().any(|record| record.key == stuck),
                "the old PROCESSING claim is listed"
            );
            assert!(listed
                .iter()
                .all(|record| record.status == idem::Status::Processing));
            let listed = store.failed(None, 100_000).await.unwrap();
            assert!(
                listed.iter().any(|record| record.key == failed),
                "the FAIL record is listed"
            );
            assert!(listed.iter().all(|record| record.status == idem::Status::Failed));
        }

        #[tokio::test]
        async fn purge_never_deletes_a_running_claim() {
            if let Some(store) = open_dyn().await {
                $crate::conformance::database::purge_never_deletes_a_running_claim(&store, edit).await;
            }
        }

        #[tokio::test]
        async fn processing_without_a_lease_is_never_free() {
            if let Some(store) = open_dyn().await {
                $crate::conformance::database::processing_without_a_lease_is_never_free(&store, edit).await;
            }
        }

        #[tokio::test]
        async fn purge_keeps_an_expired_claim_without_a_lease() {
            if let Some(store) = open_dyn().await {
                $crate::conformance::database::purge_keeps_an_expired_claim_without_a_lease(&store, edit).await;
            }
        }

        #[tokio::test]
        async fn expired_claim_without_a_lease_is_claimed_with_one() {
            if let Some(store) = open_dyn().await {
                $crate::conformance::database::expired_claim_without_a_lease_is_claimed_with_one(&store, edit).await;
            }
        }

        #[tokio::test]
        async fn unreachable_database_fails_closed() {
            $crate::conformance::database::unreachable_database_fails_closed(&unreachable()).await;
        }
    };
}
