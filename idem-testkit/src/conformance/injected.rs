//! Scenarios with a fault injected into the store under test (see `faulty.rs`): each is
//! a path on which a body ran twice or a caller got the wrong answer before its guard
//! existed, and each fails when that guard is removed (docs/RELIABILITY.md lists the
//! mutations tried).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::{idempotent, Error, Idempotent, Status};
use serde::{Deserialize, Serialize};

use super::calls::*;
use super::faulty::{Fault, FaultyStore, Op};
use super::unique;

#[idempotent(key = key, biz = "injected.pay", store = store)]
async fn charge(store: &Store, key: &str, runs: &Runs) -> Result<Receipt, AppError> {
    Ok(Receipt {
        charge_no: runs.hit(),
        cents: 250,
    })
}

#[idempotent(key = key, biz = "injected.pay", store = store)]
async fn charge_slowly(store: &Store, key: &str, runs: &Runs, delay: Duration) -> Result<Receipt, AppError> {
    let charge_no = runs.hit();
    tokio::time::sleep(delay).await;
    Ok(Receipt { charge_no, cents: 250 })
}

#[idempotent(key = key, biz = "injected.lease", store = store, lease = "300ms", clock_tolerance = "0s")]
async fn held(store: &Store, key: &str, runs: &Runs, delay: Duration) -> Result<u32, AppError> {
    let n = runs.hit();
    tokio::time::sleep(delay).await;
    Ok(n)
}

#[idempotent(key = key, biz = "injected.lease", store = store, lease = "300ms", clock_tolerance = "0s")]
async fn abandoning(store: &Store, key: &str, runs: &Runs) -> Result<(String, bool), AppError> {
    let context = idem::context().expect("inside a call");
    runs.hit();
    let ended = tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(10)) => "finished",
        () = context.lease_lost() => "abandoned",
    };
    Ok((ended.to_owned(), context.lease_held()))
}

#[idempotent(key = key, biz = "injected.pay", store = store, wait = "50ms")]
async fn charge_briefly_waiting(store: &Store, key: &str, runs: &Runs) -> Result<Receipt, AppError> {
    Ok(Receipt {
        charge_no: runs.hit(),
        cents: 250,
    })
}

#[idempotent(key = key, biz = "injected.pay", store = store, wait = "5s")]
async fn charge_twice_over(store: &Store, key: &str, runs: &Runs) -> Result<Receipt, AppError> {
    runs.hit();
    // The same (biz, key) from inside its own body.
    charge_briefly_waiting(store, key, runs).await
}

#[idempotent(key = key, biz = "injected.floats", store = store)]
async fn echo_floats(store: &Store, key: &str, values: Vec<f64>, runs: &Runs) -> Result<Vec<f64>, AppError> {
    runs.hit();
    Ok(values)
}

#[idempotent(key = key, biz = "injected.floats", store = store)]
async fn echo_maybe(
    store: &Store,
    key: &str,
    value: Option<Option<f64>>,
    runs: &Runs,
) -> Result<Option<Option<f64>>, AppError> {
    runs.hit();
    Ok(value)
}

/// Balances by account and the accounts' tags: a map and a set that iterate in an order
/// of their own.
type Ledger = (HashMap<String, u64>, HashSet<String>);

#[idempotent(key = key, biz = "injected.ledger", store = store)]
async fn echo_ledger(store: &Store, key: &str, ledger: Ledger, runs: &Runs) -> Result<Ledger, AppError> {
    runs.hit();
    Ok(ledger)
}

/// A payload holding a set: its order does not matter.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Basket {
    /// Its `id`.
    pub id: String,
    /// Its `skus`.
    pub skus: idem::Unordered<HashSet<String>>,
    /// Its `total`.
    pub total: u128,
}

#[idempotent(key = "basket.id", biz = "injected.basket", store = store, payload = basket, keep_request = true)]
async fn check_out(store: &Store, basket: Basket, runs: &Runs) -> Result<u128, AppError> {
    runs.hit();
    Ok(basket.total)
}

async fn status_of(store: &Store, biz: &str, key: &str) -> Option<Status> {
    store.get(biz, key).await.unwrap().map(|record| record.status)
}

/// Wait until the record of `key` is `status`.
async fn until_status(store: &Store, biz: &str, key: &str, status: Status) {
    super::until(&format!("{key} becoming {status}"), || async {
        status_of(store, biz, key).await == Some(status)
    })
    .await;
}

/// The body finished, `complete` fails for a moment, and the caller is
/// dropped meanwhile: the outcome is still recorded, and nothing runs twice.
pub async fn outcome_is_recorded_after_the_caller_is_dropped(store: &Store) {
    let faulty = FaultyStore::new(store);
    // Three failed writes, then one that takes seconds: the duplicate below is
    // answered while the outcome is still unrecorded, however slow this machine is.
    faulty.inject(Op::Complete, Fault::Fail, 3);
    faulty.inject(Op::Complete, Fault::Delay(Duration::from_secs(3)), 1);
    let shared = faulty.shared();
    let (key, runs) = (unique("dropped"), Runs::default());
    // The caller gives up once the body ran, while the outcome is being retried.
    super::dropped_once(
        charge(&shared, &key, &runs),
        super::until("the body", || std::future::ready(runs.count() == 1)),
    )
    .await;
    assert_eq!(runs.count(), 1);
    let error = charge(&shared, &key, &runs).await.unwrap_err().idem();
    assert!(
        matches!(error, Error::InProgress { .. }),
        "until it is recorded, a duplicate waits its turn: {error:?}"
    );
    until_status(store, "injected.pay", &key, Status::Succeeded).await;
    let replayed = charge(&shared, &key, &runs).await.unwrap();
    assert_eq!(replayed.charge_no, 1, "the first result, recorded without its caller");
    assert_eq!(runs.count(), 1, "the body ran once");
    assert!(faulty.calls(Op::Complete) >= 4, "the write was retried past the caller");
}

/// `on_error = Record` whose `fail` fails once still records FAIL; a
/// release that fails once still frees the key.
pub async fn failure_outcomes_are_retried(store: &Store) {
    let faulty = FaultyStore::new(store);
    faulty.inject(Op::Fail, Fault::Fail, 1);
    let shared = faulty.shared();
    let (key, runs) = (unique("fail-once"), Runs::default());
    let error = flaky_record(&shared, &key, &runs, true).await.unwrap_err();
    assert!(matches!(error, AppError::Declined(_)), "{error:?}");
    let again = flaky_record(&shared, &key, &runs, false).await.unwrap_err().idem();
    assert!(matches!(again, Error::PreviousFailed { .. }), "{again:?}");
    assert_eq!(runs.count(), 1);
    assert_eq!(faulty.calls(Op::Fail), 2);

    faulty.inject(Op::Release, Fault::Fail, 1);
    let (key, runs) = (unique("release-once"), Runs::default());
    assert!(flaky_release(&shared, &key, &runs, true).await.is_err());
    assert_eq!(
        flaky_release(&shared, &key, &runs, false).await.unwrap(),
        2,
        "the retry runs at once, not after the lease"
    );
}

/// A claim that waited most of its lease renews it before the body starts,
/// so a duplicate arriving just after cannot take the key over.
pub async fn late_claim_renews_before_the_body(store: &Store) {
    let faulty = FaultyStore::new(store);
    // The claim's instant is taken before it waits 290 ms of its 300 ms lease.
    faulty.inject(Op::Claim, Fault::Delay(Duration::from_millis(290)), 1);
    let shared = faulty.shared();
    let (key, runs) = (unique("late-claim"), Arc::new(Runs::default()));
    let first = {
        let (shared, key, runs) = (shared.clone(), key.clone(), runs.clone());
        tokio::spawn(async move { held(&shared, &key, &runs, Duration::from_millis(400)).await })
    };
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Past the granted lease's end, before the first heartbeat.
    tokio::time::sleep(Duration::from_millis(40)).await;
    let error = held(&shared, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(runs.count(), 1, "the body never ran twice");
}

/// `complete` commits but its reply is lost; the retry finds the record
/// finished under this call's own fence: the caller gets its result, not `LeaseLost`.
pub async fn lost_reply_of_a_committed_complete_is_success(store: &Store) {
    let faulty = FaultyStore::new(store);
    faulty.inject(Op::Complete, Fault::CommitThenFail, 1);
    let shared = faulty.shared();
    let (key, runs) = (unique("lost-reply"), Runs::default());
    let receipt = charge(&shared, &key, &runs).await.expect("its own result");
    assert_eq!(receipt.charge_no, 1);
    assert_eq!(charge(&shared, &key, &runs).await.unwrap(), receipt);
    assert_eq!(runs.count(), 1);
}

/// `complete` refused as if the key had been taken over, while the record is still
/// held under the call's lease (a node behind the one that granted the claim): the
/// outcome is written again and the caller gets its result, not `LeaseLost`, so the
/// finished body is not left to be taken over and run again. A store that keeps
/// refusing is believed after a few tries.
pub async fn a_refusal_the_record_contradicts_is_written_again(store: &Store) {
    let faulty = FaultyStore::new(store);
    faulty.inject(Op::Complete, Fault::Fenced, 1);
    let shared = faulty.shared();
    let (key, runs) = (unique("contradicted"), Runs::default());
    let receipt = charge(&shared, &key, &runs)
        .await
        .expect("a refusal its own record contradicts cost the caller its result");
    assert_eq!(receipt.charge_no, 1);
    let record = store.get("injected.pay", &key).await.unwrap().expect("the record");
    assert_eq!(record.status, Status::Succeeded, "the outcome was not written again");
    assert_eq!(charge(&shared, &key, &runs).await.unwrap(), receipt);
    assert_eq!(runs.count(), 1);

    let faulty = FaultyStore::new(store);
    faulty.inject(Op::Complete, Fault::Fenced, 10);
    let shared = faulty.shared();
    let (key, runs) = (unique("refused"), Runs::default());
    let refused = charge(&shared, &key, &runs).await;
    assert!(
        matches!(refused, Err(AppError::Idem(Error::LeaseLost { .. }))),
        "a store that keeps refusing was not believed: {refused:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// Every finite double replays with its exact bits; NaN, infinities and
/// `Some(None)` fail the first call with `Encode`, and nothing is recorded SUCCESS.
pub async fn replays_equal_the_first_answer(store: &Store) {
    let values: Vec<f64> = super::faulty::random_doubles(0x9E37_79B9_7F4A_7C15, 2000)
        .into_iter()
        .chain([0.1, 1.0 / 3.0, -0.0, f64::MIN_POSITIVE, f64::MAX, 5e-324])
        .collect();
    let (key, runs) = (unique("floats"), Runs::default());
    let first = echo_floats(store, &key, values.clone(), &runs).await.unwrap();
    let replayed = echo_floats(store, &key, vec![], &runs).await.unwrap();
    assert_eq!(runs.count(), 1);
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&first), bits(&values));
    assert_eq!(bits(&replayed), bits(&values), "every double replays bit for bit");

    for (name, value) in [
        ("nan", Some(Some(f64::NAN))),
        ("inf", Some(Some(f64::INFINITY))),
        ("some-none", Some(None)),
    ] {
        let (key, runs) = (unique(name), Runs::default());
        let error = echo_maybe(store, &key, value, &runs).await.unwrap_err().idem();
        assert!(
            matches!(error, Error::Encode { what: "response", .. }),
            "{name}: {error:?}"
        );
        assert_eq!(
            status_of(store, "injected.floats", &key).await,
            Some(Status::Failed),
            "{name}"
        );
        let again = echo_maybe(store, &key, value, &runs).await.unwrap_err().idem();
        assert!(matches!(again, Error::PreviousFailed { .. }), "{name}: {again:?}");
        assert_eq!(runs.count(), 1, "{name}: the body ran once");
    }
}

/// An answer holding a `HashMap` and a `HashSet` is recorded and replays equal: read
/// back, they iterate in another order and are still the same value.
pub async fn maps_and_sets_replay_as_answered(store: &Store) {
    let ledger: Ledger = (
        (0..32).map(|i| (format!("acct-{i}"), i)).collect(),
        (0..32).map(|i| format!("tag-{i}")).collect(),
    );
    for round in 0..5 {
        let (key, runs) = (unique(&format!("ledger-{round}")), Runs::default());
        let first = echo_ledger(store, &key, ledger.clone(), &runs)
            .await
            .expect("a map and a set are answered");
        let replayed = echo_ledger(store, &key, (HashMap::new(), HashSet::new()), &runs)
            .await
            .unwrap();
        assert_eq!((first, replayed.clone()), (ledger.clone(), ledger.clone()));
        assert_eq!(runs.count(), 1, "the body ran once");
    }
}

/// A payload holding a `HashSet` marked `Unordered` fingerprints the same on every retry, and
/// integers past 2^64 fingerprint.
pub async fn equal_payloads_fingerprint_equal(store: &Store) {
    let id = unique("basket");
    let skus: Vec<String> = (0..32).map(|i| format!("sku-{i}")).collect();
    let basket = |total| Basket {
        id: id.clone(),
        skus: idem::Unordered(skus.iter().cloned().collect()),
        total,
    };
    let big = u128::from(u64::MAX) + 7;
    let runs = Runs::default();
    for _ in 0..20 {
        // A new set each time: a new iteration order.
        assert_eq!(check_out(store, basket(big), &runs).await.unwrap(), big);
    }
    assert_eq!(runs.count(), 1);
    let error = check_out(store, basket(big + 1), &runs).await.unwrap_err().idem();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");
    let record = store.get("injected.basket", &id).await.unwrap().unwrap();
    let copy: serde_json::Value = serde_json::from_str(record.request_body.as_deref().unwrap()).unwrap();
    assert_eq!(
        copy["id"],
        id.as_str(),
        "the payload is kept, as `keep_request = true` asked"
    );
}

/// A body whose lease was taken over learns it from its context.
pub async fn lost_lease_is_signalled_to_the_body(store: &Store) {
    let faulty = FaultyStore::new(store);
    let shared = faulty.shared();
    let key = unique("abandoned");
    // The claim is slowed past a third of the lease, as a loaded machine slows it: the
    // call renews before the body, and that renewal must not meet the fault.
    faulty.inject(Op::Claim, Fault::Delay(Duration::from_millis(150)), 1);
    let first_runs = Arc::new(Runs::default());
    let first = {
        let (shared, key, first_runs) = (shared.clone(), key.clone(), first_runs.clone());
        tokio::spawn(async move { abandoning(&shared, &key, &first_runs).await })
    };
    // Once the body runs, renewals fail, the 300 ms lease lapses, and another call
    // takes the key over.
    first_runs.started("the first body").await;
    faulty.inject(Op::Renew, Fault::Fail, u32::MAX);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let runs = Runs::default();
    let taken = held(store, &key, &runs, Duration::ZERO).await.unwrap();
    assert_eq!(taken, 1, "the key was taken over");
    faulty.heal();
    // Left alone, the body would sleep 10 s.
    let ended = tokio::time::timeout(Duration::from_secs(5), first).await;
    let error = ended
        .expect("the body stopped when its lease was lost")
        .unwrap()
        .unwrap_err()
        .idem();
    assert!(
        matches!(error, Error::LeaseLost { .. }),
        "the first body stopped when told, and its outcome was fenced: {error:?}"
    );
    assert!(
        faulty.calls(Op::Renew) >= 3,
        "a failed renewal is retried within the lease"
    );
}

/// A duplicate waits by reading, never by claiming again, and `wait`
/// bounds the whole call even when the store is slow to answer.
pub async fn waiting_reads_within_its_deadline(store: &Store) {
    let faulty = FaultyStore::new(store);
    let shared = faulty.shared();
    let (key, runs) = (unique("wait-reads"), Arc::new(Runs::default()));
    let holder = {
        let (shared, key, runs) = (shared.clone(), key.clone(), runs.clone());
        tokio::spawn(async move { charge_slowly(&shared, &key, &runs, Duration::from_millis(600)).await })
    };
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let claims = faulty.calls(Op::Claim);
    let error = charge_briefly_waiting(&shared, &key, &runs).await.unwrap_err().idem();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(faulty.calls(Op::Claim) - claims, 1, "one claim, then reads");
    assert!(faulty.calls(Op::Get) >= 1);

    faulty.inject(Op::Get, Fault::Delay(Duration::from_secs(10)), 1);
    let started = Instant::now();
    let error = charge_briefly_waiting(&shared, &key, &runs).await.unwrap_err().idem();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a 50 ms wait does not sit out a 10 s read"
    );
    holder.await.unwrap().unwrap();
    assert_eq!(runs.count(), 1);
}

/// A body that calls its own key fails at once instead of waiting on itself.
pub async fn reentrant_call_fails_at_once(store: &Store) {
    let (key, runs) = (unique("reentrant"), Runs::default());
    let error = charge_twice_over(store, &key, &runs).await.unwrap_err().idem();
    assert!(
        matches!(&error, Error::Reentrant { key: k, .. } if *k == key),
        "{error:?}"
    );
    assert!(error.to_string().contains("from inside its own body"), "{error}");
    assert_eq!(runs.count(), 1);
}

/// Durations out of range are an error, never a panic; the longest allowed
/// is held by every store (a record that far ahead is live, replays and is not purged).
pub async fn durations_are_bounded_by_what_stores_hold(store: &Store) {
    let cases = [
        ("ttl", Idempotent::new("injected.bounds").ttl(Duration::MAX)),
        ("ttl", Idempotent::new("injected.bounds").ttl(Duration::ZERO)),
        ("lease", Idempotent::new("injected.bounds").lease(Duration::ZERO)),
        ("lease", Idempotent::new("injected.bounds").lease(Duration::MAX)),
        ("wait", Idempotent::new("injected.bounds").wait(Duration::MAX)),
    ];
    for (name, op) in cases {
        let op = op.store(store.clone());
        let ran = Runs::default();
        let result: Result<u32, Error> = op.execute("k", async { Ok(ran.hit()) }).await;
        let error = result.unwrap_err();
        assert!(
            matches!(&error, Error::InvalidOption { option, .. } if *option == name),
            "{error:?}"
        );
        assert_eq!(ran.count(), 0, "nothing ran");
    }

    let century = idem::MAX_DURATION;
    let op = Idempotent::new("injected.bounds").ttl(century).store(store.clone());
    let (key, runs) = (unique("century"), Runs::default());
    let first: u32 = op.execute(&key, async { Ok::<_, Error>(runs.hit()) }).await.unwrap();
    let again: u32 = op.execute(&key, async { Ok::<_, Error>(runs.hit()) }).await.unwrap();
    assert_eq!((first, again, runs.count()), (1, 1, 1));
    let record = store.get("injected.bounds", &key).await.unwrap().unwrap();
    assert!(record.expires_at > idem::store::now() + century - Duration::from_secs(3600));
    store.purge_expired(idem::store::now(), 100_000).await.unwrap();
    assert!(
        store.get("injected.bounds", &key).await.unwrap().is_some(),
        "a record a century ahead is not expired"
    );
}

/// Renewals failing for a while do not cost the lease; a `complete` that
/// keeps failing reaches the caller as `Error::Store` with its cause, and the outcome is
/// recorded once the store answers again.
pub async fn store_failures_while_holding_keep_the_key(store: &Store) {
    let faulty = FaultyStore::new(store);
    let shared = faulty.shared();
    let (key, runs) = (unique("renew-blips"), Arc::new(Runs::default()));
    let holder = {
        let (shared, key, runs) = (shared.clone(), key.clone(), runs.clone());
        tokio::spawn(async move { held(&shared, &key, &runs, Duration::from_millis(700)).await })
    };
    // Once the body runs (a claim slowed past a third of the lease renews before it, and
    // that renewal is not the heartbeat's), three renewals fail: retried at a quarter
    // beat, the lease survives them.
    runs.started("the holder's body").await;
    faulty.inject(Op::Renew, Fault::Fail, 3);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let error = held(&shared, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    assert!(matches!(error, Error::InProgress { .. }), "{error:?}");
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    assert_eq!(runs.count(), 1);

    faulty.inject(Op::Complete, Fault::Fail, 1000);
    let (key, runs) = (unique("complete-down"), Runs::default());
    let error = held(&shared, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    match &error {
        Error::Store { operation, source, .. } => {
            assert_eq!(*operation, "complete");
            assert!(source.to_string().contains("injected fault on Complete"), "{source}");
        }
        other => panic!("expected Error::Store, got {other:?}"),
    }
    faulty.heal();
    until_status(store, "injected.lease", &key, Status::Succeeded).await;
    assert_eq!(held(&shared, &key, &runs, Duration::ZERO).await.unwrap(), 1);
    assert_eq!(runs.count(), 1, "the body ran once");
}

/// A store that keeps refusing a finished body's response: after twenty leases of tries
/// the outcome is recorded as a failure, so a duplicate gets `PreviousFailed` and the
/// body does not run again.
pub async fn a_response_the_store_keeps_refusing_is_recorded_as_failed(store: &Store) {
    let faulty = FaultyStore::new(store);
    faulty.inject(Op::Complete, Fault::Fail, u32::MAX);
    let shared = faulty.shared();
    let (key, runs) = (unique("refused-response"), Runs::default());
    let error = held(&shared, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    assert!(
        matches!(
            error,
            Error::Store {
                operation: "complete",
                ..
            }
        ),
        "{error:?}"
    );
    until_status(store, "injected.lease", &key, Status::Failed).await;
    let error = held(&shared, &key, &runs, Duration::ZERO).await.unwrap_err().idem();
    match &error {
        Error::PreviousFailed { message, .. } => {
            assert!(message.contains("response could not be recorded"), "{message}")
        }
        other => panic!("expected PreviousFailed, got {other:?}"),
    }
    assert_eq!(runs.count(), 1, "the body ran once");
}

#[derive(Debug, Serialize)]
struct Transfer {
    legs: Vec<(String, i64)>,
}

#[idempotent(key = key, biz = "injected.transfer", store = store, payload = transfer)]
async fn transfer(store: &Store, key: &str, transfer: &Transfer, runs: &Runs) -> Result<u32, AppError> {
    Ok(runs.hit())
}

/// Lists are ordered: the legs of a transfer reordered under a reused key are another
/// request (`PayloadMismatch`), never a replay of the first.
pub async fn reordered_lists_are_another_payload(store: &Store) {
    let key = unique("transfer");
    let runs = Runs::default();
    let leg = |account: &str, cents| (account.to_owned(), cents);
    let first = Transfer {
        legs: vec![leg("acct-1", -500), leg("acct-2", 300), leg("acct-3", 200)],
    };
    let reordered = Transfer {
        legs: vec![leg("acct-2", 300), leg("acct-1", -500), leg("acct-3", 200)],
    };
    assert_eq!(transfer(store, &key, &first, &runs).await.unwrap(), 1);
    assert_eq!(
        transfer(store, &key, &first, &runs).await.unwrap(),
        1,
        "the same list replays"
    );
    let error = transfer(store, &key, &reordered, &runs).await.unwrap_err().idem();
    assert!(matches!(error, Error::PayloadMismatch { .. }), "{error:?}");
    assert_eq!(runs.count(), 1);
}

/// The first call's body cuts its store off (an outage, or a partition of this
/// process) the moment its effect is done.
#[idempotent(key = key, biz = "injected.outage", store = store, lease = "2s")]
async fn charge_then_lose_the_store(
    store: &Store,
    key: &str,
    runs: &Runs,
    faulty: &FaultyStore,
) -> Result<u32, AppError> {
    let n = runs.hit();
    if n == 1 {
        faulty.cut_off();
    }
    Ok(n)
}

/// The window of a finished body whose store goes away (docs/RELIABILITY.md, "Database
/// outages"), on its safe side: the store is down for 1.8 s of a 2 s lease, from the
/// moment the body's effect is done, while a client retries every 20 ms. The outcome
/// writer tries again every twentieth of a lease, so it reaches the store when it is
/// back and before the lease lapses: one body, and every later answer is its replay.
pub async fn an_outage_shorter_than_the_lease_runs_a_finished_body_once(store: &Store) {
    let faulty = FaultyStore::new(store);
    let shared = faulty.shared();
    let (key, runs) = (unique("outage"), Arc::new(Runs::default()));
    let first = {
        let (shared, key, runs, faulty) = (shared.clone(), key.clone(), runs.clone(), faulty.clone());
        tokio::spawn(async move { charge_then_lose_the_store(&shared, &key, &runs, &faulty).await })
    };
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let down_at = Instant::now();
    let healer = {
        let faulty = faulty.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until((down_at + Duration::from_millis(1800)).into()).await;
            faulty.heal();
        })
    };
    let mut replays = 0;
    while down_at.elapsed() < Duration::from_millis(3000) {
        match charge_then_lose_the_store(&shared, &key, &runs, &faulty).await {
            Ok(n) => {
                assert_eq!(n, 1, "a retry got the first answer");
                replays += 1;
            }
            Err(error) => match error.idem() {
                Error::Store { .. } | Error::InProgress { .. } => {}
                other => panic!("unexpected answer to a retry: {other:?}"),
            },
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    healer.await.unwrap();
    assert_eq!(runs.count(), 1, "the finished body did not run again");
    assert!(replays > 0, "the retries got the replay once the store was back");
    match first.await.unwrap() {
        Ok(1) => {}
        Err(error) => assert!(matches!(error.idem(), Error::Store { .. })),
        other => panic!("the first caller got {other:?}"),
    }
    let record = store.get("injected.outage", &key).await.unwrap().unwrap();
    assert_eq!(record.status, Status::Succeeded);
}

#[idempotent(key = key, biz = "injected.outage", store = store, lease = "1s", clock_tolerance = "0s")]
async fn charge_then_get_cut_off(store: &Store, key: &str, runs: &Runs, faulty: &FaultyStore) -> Result<u32, AppError> {
    let n = runs.hit();
    if n == 1 {
        faulty.cut_off();
    }
    Ok(n)
}

/// The same window past its edge: the finished body's process is cut off from the
/// store longer than its lease while another process reaches it. Before the lease
/// lapses a retry gets `InProgress`; after, nothing can tell the finished holder from a
/// dead one and the retry takes the key over and runs the body again, and the first
/// holder's outcome is refused by the fence. This is the crash-after-the-effect window
/// of leased mode: transactional mode, or steps with effect keys, close it.
pub async fn a_writer_cut_off_past_its_lease_is_taken_over(store: &Store) {
    let faulty = FaultyStore::new(store);
    let shared = faulty.shared();
    let (key, runs) = (unique("cut-off"), Arc::new(Runs::default()));
    let first = {
        let (shared, key, runs, faulty) = (shared.clone(), key.clone(), runs.clone(), faulty.clone());
        tokio::spawn(async move { charge_then_get_cut_off(&shared, &key, &runs, &faulty).await })
    };
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let cut_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let inside = charge_then_get_cut_off(store, &key, &runs, &faulty)
        .await
        .unwrap_err()
        .idem();
    assert!(
        matches!(inside, Error::InProgress { .. }),
        "inside the lease the retry waits for the holder: {inside:?}"
    );
    tokio::time::sleep_until((cut_at + Duration::from_millis(1300)).into()).await;
    let past = charge_then_get_cut_off(store, &key, &runs, &faulty).await.unwrap();
    assert_eq!(
        (past, runs.count()),
        (2, 2),
        "past the lease the retry took the key over"
    );
    faulty.heal();
    let first = first.await.unwrap();
    assert!(
        matches!(
            first,
            Err(AppError::Idem(Error::Store { .. } | Error::LeaseLost { .. }))
        ),
        "{first:?}"
    );
    let settled = Instant::now() + Duration::from_secs(10);
    loop {
        let record = store.get("injected.outage", &key).await.unwrap().unwrap();
        assert_eq!(
            record.response_body.as_deref().unwrap_or("2"),
            "2",
            "the first holder's outcome was refused"
        );
        if Instant::now() > settled {
            break;
        }
        if faulty.calls(Op::Complete) > faulty.errors(Op::Complete) || faulty.calls(Op::Get) > faulty.errors(Op::Get) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(charge_then_get_cut_off(store, &key, &runs, &faulty).await.unwrap(), 2);
}
