//! The scenarios every store passes, one async fn each.

use std::sync::Arc;
use std::time::Duration;

use idem::{Error, Status};

use super::calls::*;
use super::unique;

const NO_DELAY: Duration = Duration::ZERO;

/// Start a call on its own task, with its own handles on the store, key and counter.
fn in_background<T, F, Fut>(store: &Store, key: &str, runs: &Arc<Runs>, call: F) -> tokio::task::JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce(Store, String, Arc<Runs>) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    tokio::spawn(call(store.clone(), key.to_owned(), runs.clone()))
}

/// A handle on `store` of its own, as another process holds one: this process's claim
/// gate knows a store by its handle, so the calls made through it claim at the store
/// beside this handle's instead of taking the outcome of their key's claim under way
/// here. (A [`FaultyStore`](super::faulty::FaultyStore) with no fault planned forwards
/// every call as it is.)
fn another_process(store: &Store) -> Store {
    Arc::new(super::faulty::FaultyStore::new(store))
}

async fn record(store: &Store, biz: &str, key: &str) -> Option<idem::Record> {
    store.get(biz, key).await.expect("the store answers get")
}

/// Wait until `key` has a record: a call started in the background has claimed it.
async fn until_claimed(store: &Store, biz: &str, key: &str) {
    super::until(&format!("the claim of {key}"), || async {
        record(store, biz, key).await.is_some()
    })
    .await;
}

/// The fence the current life of `key` began with (its `created_at` in microseconds);
/// each takeover within the life adds one.
async fn life_fence(store: &Store, biz: &str, key: &str) -> u64 {
    super::first_fence(&record(store, biz, key).await.expect("a record"))
}

/// Scenario: First call runs once and records success.
pub async fn first_call_runs_once_and_records_success(store: &Store) {
    let key = unique("first");
    let runs = Runs::default();
    let receipt = pay(store, &key, &runs, NO_DELAY).await.unwrap();
    assert_eq!(
        receipt,
        Receipt {
            charge_no: 1,
            cents: 199
        }
    );
    let stored = record(store, "conformance.pay", &key).await.expect("a record");
    assert_eq!(stored.status, Status::Succeeded);
    assert_eq!(
        stored.fence,
        super::first_fence(&stored),
        "a new key's fence is its claim's instant"
    );
    assert_eq!(stored.response_body.as_deref(), Some(r#"{"charge_no":1,"cents":199}"#));
    assert!(stored.completed_at.is_some());
    assert!(stored.expires_at > stored.completed_at.unwrap() + Duration::from_secs(23 * 3600));
}

/// Scenario: Repeat replays without running.
pub async fn repeat_replays_without_running(store: &Store) {
    let key = unique("repeat");
    let runs = Runs::default();
    let first = pay(store, &key, &runs, NO_DELAY).await.unwrap();
    for _ in 0..3 {
        assert_eq!(pay(store, &key, &runs, NO_DELAY).await.unwrap(), first);
    }
    assert_eq!(runs.count(), 1);
}

/// Scenario: Reject mode refuses duplicates.
pub async fn reject_mode_refuses_duplicates(store: &Store) {
    let key = unique("reject");
    let runs = Runs::default();
    pay_rejecting(store, &key, &runs).await.unwrap();
    let error = pay_rejecting(store, &key, &runs).await.unwrap_err().idem();
    assert!(
        matches!(&error, Error::Duplicate { biz, key: k } if biz == "conformance.pay" && *k == key),
        "{error:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// Scenario: Concurrent duplicates run once — each on a handle of its own, so that
/// their claims meet at the store as separate processes' do.
pub async fn concurrent_duplicates_run_once(store: &Store) {
    let key = unique("storm");
    let runs = Arc::new(Runs::default());
    let calls = (0..64).map(|_| {
        in_background(&another_process(store), &key, &runs, |store, key, runs| async move {
            pay(&store, &key, &runs, Duration::from_millis(200)).await
        })
    });
    let results = futures::future::join_all(calls).await;
    let mut ok = 0;
    for result in results {
        match result.unwrap() {
            Ok(receipt) => {
                assert_eq!(receipt.charge_no, 1);
                ok += 1;
            }
            Err(AppError::Idem(Error::InProgress { .. })) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(runs.count(), 1, "the body ran once");
    assert!(ok >= 1, "the first caller got its receipt");
}

/// Scenario: Concurrent duplicates with wait all get the first result.
pub async fn concurrent_duplicates_with_wait_all_get_the_first_result(store: &Store) {
    let key = unique("storm-wait");
    let runs = Arc::new(Runs::default());
    let calls = (0..64).map(|_| {
        in_background(store, &key, &runs, |store, key, runs| async move {
            pay_waiting(&store, &key, &runs, Duration::from_millis(200)).await
        })
    });
    for result in futures::future::join_all(calls).await {
        assert_eq!(
            result.unwrap().unwrap(),
            Receipt {
                charge_no: 1,
                cents: 199
            }
        );
    }
    assert_eq!(runs.count(), 1);
}

/// Scenario: Duplicate in progress gets in progress.
pub async fn duplicate_in_progress_gets_in_progress(store: &Store) {
    let key = unique("in-progress");
    let runs = Arc::new(Runs::default());
    let first = in_background(store, &key, &runs, |store, key, runs| async move {
        pay(&store, &key, &runs, Duration::from_millis(500)).await
    });
    until_claimed(store, "conformance.pay", &key).await;
    let error = pay(store, &key, &runs, NO_DELAY).await.unwrap_err().idem();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(first.await.unwrap().unwrap().charge_no, 1);
    assert_eq!(runs.count(), 1);
}

/// Scenario: Wait returns the first result.
pub async fn wait_returns_the_first_result(store: &Store) {
    let key = unique("wait");
    let runs = Arc::new(Runs::default());
    let first = in_background(store, &key, &runs, |store, key, runs| async move {
        pay(&store, &key, &runs, Duration::from_millis(400)).await
    });
    until_claimed(store, "conformance.pay", &key).await;
    let waited = pay_waiting(store, &key, &runs, NO_DELAY).await.unwrap();
    assert_eq!(waited, first.await.unwrap().unwrap());
    assert_eq!(runs.count(), 1);
}

fn order(id: &str, cents: u64, second_line: u32) -> Order {
    Order {
        id: id.to_owned(),
        cents,
        lines: vec![("apple".into(), 1), ("pear".into(), second_line)],
    }
}

/// Scenario: Payload mismatch is refused and record untouched.
pub async fn payload_mismatch_is_refused_and_record_untouched(store: &Store) {
    let id = unique("order");
    let runs = Arc::new(Runs::default());
    // While the first is still PROCESSING ...
    let first = {
        let (store, runs, order) = (store.clone(), runs.clone(), order(&id, 500, 2));
        tokio::spawn(async move { place(&store, order, &runs, Duration::from_millis(300)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let error = place(store, order(&id, 500, 3), &runs, NO_DELAY)
        .await
        .unwrap_err()
        .idem();
    assert!(
        matches!(error, Error::PayloadMismatch { .. }),
        "nested field differs: {error:?}"
    );
    assert_eq!(first.await.unwrap().unwrap(), 500);
    let before = record(store, "conformance.order", &id).await.unwrap();
    // ... and after it finished.
    let error = place(store, order(&id, 900, 2), &runs, NO_DELAY)
        .await
        .unwrap_err()
        .idem();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");
    assert_eq!(
        record(store, "conformance.order", &id).await.unwrap(),
        before,
        "the record is untouched"
    );
    assert_eq!(runs.count(), 1);
}

/// Scenario: Identical payload replays.
pub async fn identical_payload_replays(store: &Store) {
    let id = unique("order-same");
    let runs = Runs::default();
    assert_eq!(place(store, order(&id, 700, 1), &runs, NO_DELAY).await.unwrap(), 700);
    assert_eq!(place(store, order(&id, 700, 1), &runs, NO_DELAY).await.unwrap(), 700);
    assert_eq!(runs.count(), 1);
    let stored = record(store, "conformance.order", &id).await.unwrap();
    assert_eq!(
        stored.fingerprint.as_deref().map(str::len),
        Some(64),
        "the fingerprint is kept on completion"
    );
}

/// Scenario: On error release lets a retry run.
pub async fn on_error_release_lets_a_retry_run(store: &Store) {
    let key = unique("release");
    let runs = Runs::default();
    let error = flaky_release(store, &key, &runs, true).await.unwrap_err();
    assert!(
        matches!(&error, AppError::Declined(m) if m == "attempt 1"),
        "the caller gets its own error: {error:?}"
    );
    assert_eq!(
        record(store, "conformance.flaky", &key).await,
        None,
        "the claim is released"
    );
    assert_eq!(
        flaky_release(store, &key, &runs, false).await.unwrap(),
        2,
        "a retry runs"
    );
    assert_eq!(
        flaky_release(store, &key, &runs, false).await.unwrap(),
        2,
        "then replays"
    );
}

/// Scenario: On error record answers previous failed.
pub async fn on_error_record_answers_previous_failed(store: &Store) {
    let key = unique("record");
    let runs = Runs::default();
    let error = flaky_record(store, &key, &runs, true).await.unwrap_err();
    assert!(matches!(&error, AppError::Declined(m) if m == "attempt 1"), "{error:?}");
    let stored = record(store, "conformance.flaky", &key).await.unwrap();
    assert_eq!(stored.status, Status::Failed);
    assert_eq!(
        stored.error_message.as_deref(),
        Some("the bank declined: attempt 1"),
        "the error's Display text is recorded"
    );
    let error = flaky_record(store, &key, &runs, false).await.unwrap_err().idem();
    assert!(
        matches!(&error, Error::PreviousFailed { message, .. } if message == "the bank declined: attempt 1"),
        "{error:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// Scenario: Expired record runs again.
pub async fn expired_record_runs_again(store: &Store) {
    let key = unique("ttl");
    let runs = Runs::default();
    let first = short_lived(store, &key, &runs).await.unwrap();
    assert_eq!(first, (1, life_fence(store, "conformance.short", &key).await));
    assert_eq!(
        short_lived(store, &key, &runs).await.unwrap(),
        first,
        "replayed within the ttl"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let again = short_lived(store, &key, &runs).await.unwrap();
    assert_eq!(again.0, 2, "runs again after the ttl");
    assert!(
        again.1 > first.1,
        "a new life's fence is above the old one's: {again:?} after {first:?}"
    );
    assert_eq!(
        again.1,
        life_fence(store, "conformance.short", &key).await,
        "a new life starts at its first instant"
    );
}

/// Scenario: Cancelled holder is taken over after its lease.
pub async fn cancelled_holder_is_taken_over_after_its_lease(store: &Store) {
    let key = unique("cancel");
    let runs = Runs::default();
    // Dropped once its claim is recorded: its body waits a minute.
    super::dropped_once(
        leased(store, &key, &runs, Duration::from_secs(60)),
        until_claimed(store, "conformance.lease", &key),
    )
    .await;
    let error = leased(store, &key, &runs, NO_DELAY).await.unwrap_err().idem();
    assert!(
        matches!(error, Error::InProgress { .. }),
        "the lease still runs: {error:?}"
    );
    // A heartbeat that outlived the dropped call would keep renewing and block this.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        leased(store, &key, &runs, NO_DELAY).await.unwrap(),
        (1, life_fence(store, "conformance.lease", &key).await + 1),
        "taken over with the next fence"
    );
}

/// Scenario: Panicking body leaves the claim to its lease.
pub async fn panicking_body_leaves_the_claim_to_its_lease(store: &Store) {
    let key = unique("panic");
    let joined = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move { panicking(&store, &key).await }).await
    };
    assert!(joined.unwrap_err().is_panic());
    let stored = record(store, "conformance.lease", &key).await.unwrap();
    assert_eq!(stored.status, Status::Processing);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let runs = Runs::default();
    let taken = leased(store, &key, &runs, NO_DELAY).await.unwrap();
    assert_eq!(taken, (1, stored.fence + 1));
}

/// Scenario: A dead holder's claim is kept for its lease and the clock tolerance: a
/// store clock that jumps ahead by less than the tolerance cannot end a running lease.
pub async fn a_claim_is_kept_for_the_clock_tolerance_past_its_lease(store: &Store) {
    let key = unique("tolerance");
    // The holder is dropped mid-body: its heartbeat goes with it.
    super::dropped_once(
        hanging_with_tolerance(store, &key),
        until_claimed(store, "conformance.lease", &key),
    )
    .await;
    let stored = record(store, "conformance.lease", &key).await.unwrap();
    assert_eq!(stored.status, Status::Processing);
    // Instants counted from the claim, by the store's instant of it.
    let after_claim = |millis: u64| {
        let at = stored.created_at + Duration::from_millis(millis);
        at.duration_since(std::time::SystemTime::now()).unwrap_or_default()
    };
    // Past the 500 ms lease, inside its 500 ms tolerance: still the dead holder's.
    tokio::time::sleep(after_claim(650)).await;
    let runs = Runs::default();
    let early = leased(store, &key, &runs, NO_DELAY).await;
    assert!(
        matches!(early, Err(AppError::Idem(Error::InProgress { .. }))),
        "{early:?}"
    );
    // Past both: taken over.
    tokio::time::sleep(after_claim(1200)).await;
    let taken = leased(store, &key, &runs, NO_DELAY).await.unwrap();
    assert_eq!(taken, (1, stored.fence + 1));
}

/// Scenario: Live holder keeps its claim past one lease.
pub async fn live_holder_keeps_its_claim_past_one_lease(store: &Store) {
    let key = unique("live");
    let runs = Arc::new(Runs::default());
    // The body outlasts the three looks below by far: on a loaded machine each look
    // (and the wait to see the claim) can take a while, and a look after the body ended
    // would meet the finished record.
    let first = in_background(store, &key, &runs, |store, key, runs| async move {
        leased(&store, &key, &runs, Duration::from_millis(3000)).await
    });
    until_claimed(store, "conformance.lease", &key).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let error = leased(store, &key, &runs, NO_DELAY).await.unwrap_err().idem();
        assert!(
            matches!(error, Error::InProgress { .. }),
            "the heartbeat keeps the claim: {error:?}"
        );
    }
    assert_eq!(
        first.await.unwrap().unwrap(),
        (1, life_fence(store, "conformance.lease", &key).await)
    );
    assert_eq!(runs.count(), 1);
}

/// Run `frozen` on its own thread and runtime, so that blocking it blocks its heartbeat
/// too, as a paused process would. The runtime is left running afterwards: a pool
/// connection the frozen call opened is registered with it and stays in the shared pool.
fn on_frozen_thread<T: Send + 'static>(
    call: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let output = runtime.block_on(call());
        std::mem::forget(runtime);
        output
    })
}

/// Scenario: Stale holder cannot complete over the new holder.
pub async fn stale_holder_cannot_complete_over_the_new_holder(store: &Store) {
    let key = unique("stale");
    let stale = {
        let (store, key) = (store.clone(), key.clone());
        on_frozen_thread(move || Box::pin(async move { frozen(&store, &key, Duration::from_millis(900), Ok(7)).await }))
    };
    tokio::time::sleep(Duration::from_millis(500)).await; // past the stale holder's lease
    let runs = Runs::default();
    let first_fence = life_fence(store, "conformance.lease", &key).await;
    assert_eq!(
        leased(store, &key, &runs, NO_DELAY).await.unwrap(),
        (1, first_fence + 1),
        "taken over"
    );
    let stored = record(store, "conformance.lease", &key).await.unwrap();
    let error = tokio::task::spawn_blocking(move || stale.join().unwrap())
        .await
        .unwrap()
        .unwrap_err()
        .idem();
    assert!(
        matches!(&error, Error::LeaseLost { fence, operation: "complete", key: k, .. } if *k == key && *fence == first_fence),
        "the stale holder is told: {error:?}"
    );
    assert_eq!(
        record(store, "conformance.lease", &key).await.unwrap(),
        stored,
        "and changed nothing"
    );
}

/// Scenario: Stale holder cannot fail or release the new record.
pub async fn stale_holder_cannot_fail_or_release_the_new_record(store: &Store) {
    for record_failure in [true, false] {
        let key = unique("stale-err");
        let stale = {
            let (store, key) = (store.clone(), key.clone());
            on_frozen_thread(move || {
                Box::pin(async move {
                    let freeze = Duration::from_millis(900);
                    if record_failure {
                        frozen(&store, &key, freeze, Err("late".into())).await
                    } else {
                        frozen_release(&store, &key, freeze).await
                    }
                })
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let runs = Runs::default();
        let first_fence = life_fence(store, "conformance.lease", &key).await;
        assert_eq!(
            leased(store, &key, &runs, NO_DELAY).await.unwrap(),
            (1, first_fence + 1)
        );
        let stored = record(store, "conformance.lease", &key).await.unwrap();
        let error = tokio::task::spawn_blocking(move || stale.join().unwrap())
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(error, AppError::Declined(_)),
            "the stale holder gets its own error: {error:?}"
        );
        assert_eq!(
            record(store, "conformance.lease", &key).await.unwrap(),
            stored,
            "the new record stands"
        );
    }
}

/// Scenario: Bad keys are refused before the body.
pub async fn bad_keys_are_refused_before_the_body(store: &Store) {
    let runs = Runs::default();
    let long = "k".repeat(256);
    for (key, says) in [
        ("", "empty"),
        (long.as_str(), "256 bytes"),
        ("a\nb", "control character"),
        ("tab\there", "control"),
    ] {
        let error = pay(store, key, &runs, NO_DELAY).await.unwrap_err().idem();
        match &error {
            Error::InvalidKey { biz, reason, .. } => {
                assert_eq!(biz, "conformance.pay");
                assert!(reason.contains(says), "{reason}");
                assert!(error.to_string().contains(says));
            }
            other => panic!("expected InvalidKey for {key:?}, got {other:?}"),
        }
        assert_eq!(
            record(store, "conformance.pay", key).await,
            None,
            "nothing recorded for {key:?}"
        );
    }
    assert_eq!(runs.count(), 0, "no body ran");
    let mut longest = unique("k") + &"k".repeat(255);
    longest.truncate(255);
    assert!(
        pay(store, &longest, &runs, NO_DELAY).await.is_ok(),
        "255 bytes is still a key"
    );
    assert_eq!(runs.count(), 1);
}

/// Scenario: Falsy looking keys are valid.
pub async fn falsy_looking_keys_are_valid(store: &Store) {
    let runs = Runs::default();
    let prefix = unique("falsy");
    for key in ["0", "false", "null"] {
        let key = format!("{prefix}:{key}");
        pay(store, &key, &runs, NO_DELAY).await.unwrap();
        pay(store, &key, &runs, NO_DELAY).await.unwrap();
    }
    assert_eq!(runs.count(), 3);
}

/// Scenario: Biz namespaces do not share records.
pub async fn biz_namespaces_do_not_share_records(store: &Store) {
    let key = unique("shared-key");
    assert_eq!(in_biz_a(store, &key).await.unwrap(), "a");
    assert_eq!(in_biz_b(store, &key).await.unwrap(), "b");
    assert_eq!(in_biz_a(store, &key).await.unwrap(), "a");
}

/// Scenario: The lease a claim grants, the record a later claim meets and the record
/// `get` reads name their biz and key (a cache in front of the store files what it is
/// handed by them).
pub async fn records_and_leases_carry_their_names(store: &Store) {
    use idem::store::{Claim, ClaimOutcome};
    let (biz, key) = ("conformance.names", unique("named"));
    let names = |biz: &str, key: &str| (biz.to_owned(), key.to_owned());
    let (lease_for, ttl) = (Duration::from_secs(30), Duration::from_secs(3600));
    let lease = granted(store, biz, &key, idem::store::now(), lease_for, ttl).await;
    assert_eq!(names(&lease.biz, &lease.key), names(biz, &key), "the lease granted");
    let claim = Claim::new(biz, &key, idem::store::now(), lease_for, ttl);
    let met = match store.claim(&claim).await.expect("the claim is answered") {
        ClaimOutcome::Existing(record) => record,
        other => panic!("a running claim is met: {other:?}"),
    };
    assert_eq!(names(&met.biz, &met.key), names(biz, &key), "the record met");
    let read = record(store, biz, &key).await.expect("the record is read");
    assert_eq!(names(&read.biz, &read.key), names(biz, &key), "the record read");
}

/// Scenario: Typed results round trip exactly.
pub async fn typed_results_round_trip_exactly(store: &Store) {
    let key = unique("types");
    let runs = Runs::default();
    let value = Awkward {
        none: None,
        zero: 0,
        no: false,
        empty: vec![],
        big: u64::MAX,
        small: i64::MIN,
        float: 0.1 + 0.2,
        shapes: vec![
            Shape::Nothing,
            Shape::Circle { r: -1.5e-7 },
            Shape::Nested(Some(Box::new(Shape::Nested(None)))),
        ],
        text: "ünïcødé \"quoted\" \\ 💳".into(),
    };
    assert_eq!(echo(store, &key, value.clone(), &runs).await.unwrap(), value);
    let other = Awkward {
        zero: 1,
        ..value.clone()
    };
    assert_eq!(
        echo(store, &key, other, &runs).await.unwrap(),
        value,
        "the replay is the first value, exactly"
    );
    let unit_key = unique("types-none");
    assert_eq!(echo_unit(store, &unit_key, &runs).await.unwrap(), None);
    assert_eq!(echo_unit(store, &unit_key, &runs).await.unwrap(), None);
    assert_eq!(runs.count(), 2);
}

/// Scenario: Two functions keep their own options.
pub async fn two_functions_keep_their_own_options(store: &Store) {
    // `pay_rejecting` rejects, `pay` replays: same biz, same store, own modes.
    let key = unique("options");
    let runs = Runs::default();
    pay(store, &key, &runs, NO_DELAY).await.unwrap();
    assert!(pay(store, &key, &runs, NO_DELAY).await.is_ok());
    assert!(matches!(
        pay_rejecting(store, &key, &runs).await.unwrap_err().idem(),
        Error::Duplicate { .. }
    ));
    assert!(pay(store, &key, &runs, NO_DELAY).await.is_ok());
    assert_eq!(runs.count(), 1);
}

/// Scenario: Context names the claim.
pub async fn context_names_the_claim(store: &Store) {
    let key = unique("ctx");
    let (biz, seen_key, fence, sms) = notify(store, &key).await.unwrap();
    assert_eq!(
        (biz.as_str(), seen_key.as_str(), fence),
        (
            "conformance.context",
            key.as_str(),
            life_fence(store, "conformance.context", &key).await
        )
    );
    let life = record(store, "conformance.context", &key).await.unwrap().created_at;
    let life = life.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros();
    assert_eq!(sms, format!("conformance.context:{key}:{life}:sms"));
    assert!(idem::context().is_none(), "no context outside a call");
}

/// Scenario: Success is never taken over before its ttl.
pub async fn success_is_never_taken_over_before_its_ttl(store: &Store) {
    let key = unique("no-takeover");
    let runs = Runs::default();
    let first = leased(store, &key, &runs, NO_DELAY).await.unwrap();
    assert_eq!(first, (1, life_fence(store, "conformance.lease", &key).await));
    tokio::time::sleep(Duration::from_millis(500)).await; // well past the 300 ms lease
    assert_eq!(leased(store, &key, &runs, NO_DELAY).await.unwrap(), first);
    assert_eq!(runs.count(), 1);
}

/// Scenario: Rejected duplicate deletes nothing.
pub async fn rejected_duplicate_deletes_nothing(store: &Store) {
    let key = unique("in-flight");
    let runs = Arc::new(Runs::default());
    let first = in_background(store, &key, &runs, |store, key, runs| async move {
        flaky_wait(&store, &key, &runs).await
    });
    until_claimed(store, "conformance.flaky", &key).await;
    // A duplicate that fails (InProgress) must not release the first call's claim.
    assert!(flaky_release(store, &key, &runs, true).await.is_err());
    let stored = record(store, "conformance.flaky", &key)
        .await
        .expect("the claim is still there");
    assert_eq!(stored.status, Status::Processing);
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(runs.count(), 1);
}

#[idem::idempotent(key = key, biz = "conformance.flaky", store = store)]
async fn flaky_wait(store: &Store, key: &str, runs: &Runs) -> Result<u32, AppError> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(runs.hit())
}

/// Scenario: Undecodable response is a decode error and kept.
pub async fn undecodable_response_is_a_decode_error_and_kept(store: &Store) {
    let key = unique("decode");
    let runs = Runs::default();
    pay(store, &key, &runs, NO_DELAY).await.unwrap();
    let before = record(store, "conformance.pay", &key).await.unwrap();
    let error = pay_v2(store, &key, &runs).await.unwrap_err().idem();
    match &error {
        Error::Decode { biz, key: k, .. } => {
            assert_eq!((biz.as_str(), k), ("conformance.pay", &key))
        }
        other => panic!("expected Decode, got {other:?}"),
    }
    assert!(error.to_string().contains(&key));
    assert_eq!(
        record(store, "conformance.pay", &key).await.unwrap(),
        before,
        "nothing deleted"
    );
    assert_eq!(runs.count(), 1);
}

/// Scenario: Purge deletes only expired records in batches.
pub async fn purge_deletes_only_expired_records_in_batches(store: &Store) {
    use idem::store::{Claim, ClaimOutcome};
    let biz = unique("purge");
    let now = idem::store::now();
    let hour = Duration::from_secs(3600);
    let claim_at = |key: &str, at, lease, ttl| {
        let key = key.to_owned();
        let biz = biz.clone();
        async move {
            match store.claim(&Claim::new(&biz, &key, at, lease, ttl)).await.unwrap() {
                ClaimOutcome::Acquired(lease) => lease,
                other => panic!("{other:?}"),
            }
        }
    };
    // Five finished records that expired an hour ago. Each is claimed with a lease that
    // still runs until its completion, so another test's purge of the shared table
    // cannot take the claim before it is completed.
    for i in 0..5 {
        let lease = claim_at(
            &format!("old-{i}"),
            now - 3 * hour,
            3 * hour + Duration::from_secs(60),
            hour,
        )
        .await;
        assert_eq!(
            store.complete(&lease, "1", now - 2 * hour, hour).await.unwrap(),
            idem::store::FenceCheck::Held
        );
    }
    // A live record, and a PROCESSING claim past its expiry whose lease still runs.
    let live = claim_at("live", now, Duration::from_secs(30), hour).await;
    let _ = store.complete(&live, "2", now, hour).await.unwrap();
    claim_at("running", now - hour, 2 * hour, Duration::from_secs(1)).await;

    let later = now + Duration::from_secs(1);
    // Another test's purge may share the table and take some of these five first:
    // what counts is that they are gone, in bounded batches, and nothing live went.
    let mut batches = 0;
    loop {
        let batch = store.purge_expired(later, 2).await.unwrap();
        assert!(batch <= 2, "batches are bounded");
        batches += 1;
        if batch == 0 {
            break;
        }
    }
    assert!(batches >= 1);
    for i in 0..5 {
        assert_eq!(store.get(&biz, &format!("old-{i}")).await.unwrap(), None);
    }
    assert!(store.get(&biz, "live").await.unwrap().is_some(), "live record kept");
    assert_eq!(
        store.get(&biz, "running").await.unwrap().unwrap().status,
        Status::Processing,
        "running claim kept"
    );
}

/// At the store: while the new holder still runs, every write of the
/// holder it took over from (renew, complete, fail, release) is refused and changes
/// nothing.
pub async fn stale_lease_writes_nothing_while_the_new_holder_runs(store: &Store) {
    use idem::store::{Claim, ClaimOutcome, FenceCheck};
    let (biz, key) = (unique("stale-store"), unique("k"));
    let now = idem::store::now();
    let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
    let acquired = |outcome| match outcome {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    };
    let stale = acquired(
        store
            .claim(&Claim::new(&biz, &key, now - hour, second, 2 * hour))
            .await
            .unwrap(),
    );
    let holder = acquired(store.claim(&Claim::new(&biz, &key, now, hour, 2 * hour)).await.unwrap());
    assert_eq!(holder.fence, stale.fence + 1, "a takeover");
    let before = record(store, &biz, &key).await.unwrap();
    assert_eq!(store.renew(&stale, now, hour).await.unwrap(), FenceCheck::Lost);
    assert_eq!(store.complete(&stale, "1", now, hour).await.unwrap(), FenceCheck::Lost);
    assert_eq!(store.fail(&stale, "late", now, hour).await.unwrap(), FenceCheck::Lost);
    assert_eq!(store.release(&stale).await.unwrap(), FenceCheck::Lost);
    assert_eq!(
        record(store, &biz, &key).await.unwrap(),
        before,
        "the new holder's record stands"
    );
    assert_eq!(store.complete(&holder, "2", now, hour).await.unwrap(), FenceCheck::Held);
}

/// The effect key is the same for a takeover within one life of the key and different
/// in its next life; the fence only grows, across a purge too.
pub async fn effect_keys_and_fences_follow_the_life_of_a_key(store: &Store) {
    let key = unique("effects");
    let seen = std::sync::Mutex::new(Vec::new());
    // Dropped once its body has begun (and sent its first message).
    super::dropped_once(
        send_sms(store, &key, &seen, Duration::from_secs(60)),
        super::until("the first message", || {
            std::future::ready(!seen.lock().unwrap().is_empty())
        }),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await; // its lease lapses
    send_sms(store, &key, &seen, NO_DELAY).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await; // the record expires ...
    while store.purge_expired(idem::store::now(), 1000).await.unwrap() > 0 {} // ... and is purged
    assert_eq!(record(store, "conformance.effects", &key).await, None);
    send_sms(store, &key, &seen, NO_DELAY).await.unwrap();
    let seen = seen.into_inner().unwrap();
    let [(first, first_sms), (taken, taken_sms), (next, next_sms)] = seen.as_slice() else {
        panic!("three bodies ran: {seen:?}")
    };
    assert_eq!(*taken, first + 1, "a takeover is the next fence");
    assert_eq!(
        taken_sms, first_sms,
        "and the same effect: a downstream dedup keeps one SMS"
    );
    assert!(next > taken, "after a purge the fence still grows: {next} > {taken}");
    assert_ne!(next_sms, taken_sms, "a new life is a new effect");
}

/// A lapsed claim is taken over only by a call whose payload agrees: another payload
/// gets the record (and `PayloadMismatch` through the executor), never the key.
pub async fn lapsed_claim_is_not_taken_over_by_another_payload(store: &Store) {
    use idem::store::{Claim, ClaimOutcome};
    let (biz, key) = (unique("lapsed-payload"), unique("k"));
    let now = idem::store::now();
    let (second, hour) = (Duration::from_secs(1), Duration::from_secs(3600));
    let first = Claim::new(&biz, &key, now - hour, second, 2 * hour).with_fingerprint(Some("f1"));
    assert!(matches!(store.claim(&first).await.unwrap(), ClaimOutcome::Acquired(_)));
    let other = Claim::new(&biz, &key, now, hour, hour).with_fingerprint(Some("f2"));
    match store.claim(&other).await.unwrap() {
        ClaimOutcome::Existing(record) => assert_eq!(record.fingerprint.as_deref(), Some("f1")),
        granted => panic!("another payload took the lapsed claim over: {granted:?}"),
    }
    let same = Claim::new(&biz, &key, now, hour, hour).with_fingerprint(Some("f1"));
    assert!(
        matches!(store.claim(&same).await.unwrap(), ClaimOutcome::Acquired(_)),
        "the same payload may"
    );
}

/// Whether a claim of `key` at `at` is refused with the running record.
async fn refused_as_running(store: &Store, biz: &str, key: &str, at: std::time::SystemTime) -> bool {
    use idem::store::{Claim, ClaimOutcome};
    let hour = Duration::from_secs(3600);
    matches!(
        store.claim(&Claim::new(biz, key, at, hour, hour)).await.unwrap(),
        ClaimOutcome::Existing(record) if record.status == Status::Processing
    )
}

/// A body that outlives its `ttl` keeps its key while it renews: a renewal extends the
/// record's life with its lease, so the record is neither expired (and claimed again
/// as a new life, a second run), nor purged, while the lease runs.
pub async fn a_renewed_claim_outlives_its_ttl(store: &Store) {
    use idem::store::FenceCheck;
    let (biz, key) = (unique("outlives"), unique("k"));
    let t0 = idem::store::now();
    let ten = Duration::from_secs(10);
    let lease = granted(store, &biz, &key, t0, ten, ten).await;
    // Renewed at 8 s for 10 s more: the lease runs to 18 s, past the ttl's 10 s.
    assert_eq!(
        store.renew(&lease, t0 + Duration::from_secs(8), ten).await.unwrap(),
        FenceCheck::Held
    );
    let at = t0 + Duration::from_secs(15);
    let running = record(store, &biz, &key).await.expect("the running claim");
    assert!(
        running.lease_until.is_some_and(|until| running.expires_at >= until),
        "a renewal extends the record's expiry with its lease: {running:?}"
    );
    assert!(
        refused_as_running(store, &biz, &key, at).await,
        "a running claim past its ttl is not claimed again"
    );
    let _ = store.purge_expired(at, 1000).await.unwrap();
    let kept = record(store, &biz, &key).await;
    assert!(
        kept.is_some_and(|r| r.status == Status::Processing && lease.holds(&r)),
        "a running claim past its ttl is not purged"
    );
    assert_eq!(store.complete(&lease, "1", at, ten).await.unwrap(), FenceCheck::Held);
}

/// A claim whose lease is longer than its `ttl` (a slow body kept briefly afterwards)
/// is the key's until its lease ends: neither taken over, nor purged, once the `ttl`
/// has passed and the lease still runs.
pub async fn a_claim_whose_lease_outlasts_its_ttl_is_kept_while_it_runs(store: &Store) {
    use idem::store::FenceCheck;
    let (biz, key) = (unique("long-lease"), unique("k"));
    let t0 = idem::store::now();
    let lease = granted(store, &biz, &key, t0, Duration::from_secs(3600), Duration::from_secs(1)).await;
    let at = t0 + Duration::from_secs(5);
    assert!(refused_as_running(store, &biz, &key, at).await, "the lease still runs");
    let _ = store.purge_expired(at, 1000).await.unwrap();
    let kept = record(store, &biz, &key).await;
    assert!(
        kept.is_some_and(|r| lease.holds(&r)),
        "a claim whose lease runs is not purged"
    );
    assert_eq!(
        store.complete(&lease, "1", at, Duration::from_secs(60)).await.unwrap(),
        FenceCheck::Held
    );
}
