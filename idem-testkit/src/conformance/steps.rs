//! Steps: a finished step is recorded with the record, fenced, and given
//! back instead of run again — after a takeover, after a release, never across lives.

use std::time::Duration;

use idem::store::{Claim, ClaimOutcome, FenceCheck, Lease};
use idem::{idempotent, step, Error, Status};

use super::calls::{AppError, Runs, Store};
use super::faulty::{Fault, FaultyStore, Op};
use super::unique;

const BIZ: &str = "conformance.steps";

/// Where the body stops after its first step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum After {
    /// Goes on to the second step.
    GoOn,
    /// Hangs (the caller drops it: the process died, as far as the record knows).
    Hang,
    /// Returns `Err` (`on_error = Release`).
    Fail,
}

/// Charges, then sends an SMS, each a step; counts each effect.
#[idempotent(key = key, biz = "conformance.steps", store = store, lease = "300ms", clock_tolerance = "0s")]
pub async fn charge_then_sms(
    store: &Store,
    key: &str,
    charges: &Runs,
    texts: &Runs,
    after: After,
) -> Result<String, AppError> {
    let charge: u32 = step("charge", async { Ok::<_, AppError>(charges.hit()) }).await?;
    match after {
        After::GoOn => {}
        After::Hang => std::future::pending::<()>().await,
        After::Fail => return Err(AppError::Declined("after the charge".into())),
    }
    let sms: u32 = step("sms", async { Ok::<_, AppError>(texts.hit()) }).await?;
    Ok(format!("charge {charge} sms {sms}"))
}

/// A step whose effect fails on its first run.
#[idempotent(key = key, biz = "conformance.steps", store = store)]
async fn flaky_step(store: &Store, key: &str, runs: &Runs) -> Result<u32, AppError> {
    step("flaky", async {
        match runs.hit() {
            1 => Err(AppError::Declined("the bank timed out".into())),
            n => Ok(n),
        }
    })
    .await
}

/// Uses one step name twice.
#[idempotent(key = key, biz = "conformance.steps", store = store)]
async fn repeated_step(store: &Store, key: &str, runs: &Runs) -> Result<u32, AppError> {
    let first: u32 = step("same", async { Ok::<_, AppError>(runs.hit()) }).await?;
    let second: u32 = step("same", async { Ok::<_, AppError>(runs.hit()) }).await?;
    Ok(first + second)
}

/// Scenario: Takeover replays finished steps.
pub async fn takeover_replays_finished_steps(store: &Store) {
    let key = unique("steps-takeover");
    let (charges, texts) = (Runs::default(), Runs::default());
    // The first attempt dies between its steps: once its charge is in the record (the
    // step's write can take a while on a loaded machine; a death before it commits is
    // a death inside the step, which runs it again), its call is dropped.
    super::dropped_once(
        charge_then_sms(store, &key, &charges, &texts, After::Hang),
        super::until("the first attempt's charge recorded", || async {
            let record = store.get(BIZ, &key).await.ok().flatten();
            record
                .and_then(|record| record.steps)
                .is_some_and(|steps| steps.contains("charge"))
        }),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let done = charge_then_sms(store, &key, &charges, &texts, After::GoOn)
        .await
        .unwrap();
    assert_eq!(done, "charge 1 sms 1", "the takeover got the recorded charge back");
    assert_eq!((charges.count(), texts.count()), (1, 1), "each effect ran once");
    let again = charge_then_sms(store, &key, &charges, &texts, After::GoOn)
        .await
        .unwrap();
    assert_eq!(again, done);
    assert_eq!((charges.count(), texts.count()), (1, 1));
}

/// Scenario: Released call keeps its steps.
pub async fn released_call_keeps_its_steps(store: &Store) {
    let key = unique("steps-release");
    let (charges, texts) = (Runs::default(), Runs::default());
    let failed = charge_then_sms(store, &key, &charges, &texts, After::Fail).await;
    assert!(matches!(failed, Err(AppError::Declined(_))), "{failed:?}");
    let kept = store
        .get(BIZ, &key)
        .await
        .unwrap()
        .expect("the record stays for its steps");
    assert_eq!(kept.status, Status::Processing);
    assert_eq!(
        kept.lease_until,
        Some(kept.created_at),
        "released: the lease lapsed at once"
    );
    assert!(kept.steps.as_deref().unwrap().contains("charge"), "{kept:?}");
    let done = charge_then_sms(store, &key, &charges, &texts, After::GoOn)
        .await
        .unwrap();
    assert_eq!(done, "charge 1 sms 1", "the retry did not charge again");
    assert_eq!((charges.count(), texts.count()), (1, 1));
    assert_eq!(store.get(BIZ, &key).await.unwrap().unwrap().status, Status::Succeeded);
}

/// Scenario: Failed step is not recorded.
pub async fn failed_step_is_not_recorded(store: &Store) {
    let key = unique("steps-failed");
    let runs = Runs::default();
    let first = flaky_step(store, &key, &runs).await;
    assert!(matches!(first, Err(AppError::Declined(_))), "{first:?}");
    assert!(
        store.get(BIZ, &key).await.unwrap().is_none(),
        "no step finished: the release deleted the record"
    );
    assert_eq!(flaky_step(store, &key, &runs).await.unwrap(), 2, "the step ran again");
    assert_eq!(flaky_step(store, &key, &runs).await.unwrap(), 2, "then replays");
    assert_eq!(runs.count(), 2);
}

/// Scenario: Step misuse is refused.
pub async fn step_misuse_is_refused(store: &Store) {
    let runs = Runs::default();
    let outside = step("charge", async { Ok::<u32, Error>(runs.hit()) })
        .await
        .unwrap_err();
    assert!(
        matches!(&outside, Error::InvalidStep { step, reason } if step == "charge" && reason.contains("outside")),
        "{outside}"
    );
    let key = unique("steps-repeated");
    let repeated = repeated_step(store, &key, &runs).await.unwrap_err().idem();
    assert!(
        matches!(&repeated, Error::InvalidStep { step, reason } if step == "same" && reason.contains("unique")),
        "{repeated}"
    );
    assert_eq!(
        runs.count(),
        1,
        "neither the outside step nor the repeated one ran its effect"
    );
}

/// Scenario: Stale holder cannot record steps.
pub async fn stale_holder_cannot_record_steps(store: &Store) {
    let key = unique("steps-fence");
    let now = idem::store::now();
    let claim = |at, lease| Claim::new(BIZ, &key, at, lease, Duration::from_secs(60));
    let acquired = |outcome| match outcome {
        ClaimOutcome::Acquired(lease) => lease,
        other => panic!("expected a grant, got {other:?}"),
    };
    let old: Lease = acquired(
        store
            .claim(&claim(now - Duration::from_secs(5), Duration::from_secs(1)))
            .await
            .unwrap(),
    );
    assert_eq!(
        store.record_steps(&old, r#"{"a":"1"}"#).await.unwrap(),
        FenceCheck::Held
    );
    let new = acquired(store.claim(&claim(now, Duration::from_secs(30))).await.unwrap());
    let taken = store.get(BIZ, &key).await.unwrap().unwrap();
    assert_eq!(
        taken.steps.as_deref(),
        Some(r#"{"a":"1"}"#),
        "a takeover keeps the life's steps"
    );
    assert_eq!(
        store.record_steps(&old, r#"{"b":"2"}"#).await.unwrap(),
        FenceCheck::Lost
    );
    assert_eq!(store.release(&old).await.unwrap(), FenceCheck::Lost);
    let kept = store.get(BIZ, &key).await.unwrap().unwrap();
    assert_eq!(
        kept.steps.as_deref(),
        Some(r#"{"a":"1"}"#),
        "the stale holder changed nothing"
    );
    assert_eq!(kept.fence, new.fence);
    assert_eq!(
        store.record_steps(&new, r#"{"a":"1","c":"3"}"#).await.unwrap(),
        FenceCheck::Held
    );
}

/// Scenario: A new life starts without steps.
pub async fn a_new_life_starts_without_steps(store: &Store) {
    let key = unique("steps-life");
    let long_ago = idem::store::now() - Duration::from_secs(3600);
    let ClaimOutcome::Acquired(old) = store
        .claim(&Claim::new(
            BIZ,
            &key,
            long_ago,
            Duration::from_secs(1),
            Duration::from_secs(2),
        ))
        .await
        .unwrap()
    else {
        panic!("the first claim is granted");
    };
    assert_eq!(
        store.record_steps(&old, r#"{"a":"1"}"#).await.unwrap(),
        FenceCheck::Held
    );
    let fresh = Claim::new(
        BIZ,
        &key,
        idem::store::now(),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    assert!(matches!(store.claim(&fresh).await.unwrap(), ClaimOutcome::Acquired(_)));
    let record = store.get(BIZ, &key).await.unwrap().unwrap();
    assert_ne!(record.created_at, old.created_at, "a new life");
    assert_eq!(record.steps, None, "the expired life's steps are not carried over");
}

/// A step's value the store fails to take once, or takes and then reports failing, is
/// offered again: the step's effect ran once and the call goes on.
pub async fn a_step_record_that_fails_once_is_offered_again(store: &Store) {
    let faulty = FaultyStore::new(store);
    let shared = faulty.shared();
    for fault in [Fault::Fail, Fault::CommitThenFail] {
        faulty.inject(Op::RecordSteps, fault, 1);
        let key = unique("steps-flaky-store");
        let (charges, texts) = (Runs::default(), Runs::default());
        let done = charge_then_sms(&shared, &key, &charges, &texts, After::GoOn).await;
        assert_eq!(done.unwrap(), "charge 1 sms 1", "{fault:?}");
        assert_eq!((charges.count(), texts.count()), (1, 1), "{fault:?}");
    }
    assert_eq!(faulty.errors(Op::RecordSteps), 2, "each fault met once");
}

/// Charges, then — on its first attempt — waits until it learns that its lease was
/// lost, then texts.
#[idempotent(key = key, biz = "conformance.steps", store = store, lease = "300ms", clock_tolerance = "0s")]
async fn charge_then_sms_after_losing(
    store: &Store,
    key: &str,
    charges: &Runs,
    texts: &Runs,
    first: bool,
) -> Result<String, AppError> {
    let charge: u32 = step("charge", async { Ok::<_, AppError>(charges.hit()) }).await?;
    if first {
        let context = idem::context().expect("inside a call");
        tokio::time::timeout(Duration::from_secs(5), context.lease_lost())
            .await
            .map_err(|_| AppError::Declined("the lease was never lost".into()))?;
    }
    let sms: u32 = step("sms", async { Ok::<_, AppError>(texts.hit()) }).await?;
    Ok(format!("charge {charge} sms {sms}"))
}

/// A step whose value JSON cannot carry (NaN).
#[idempotent(key = key, biz = "conformance.steps", store = store)]
async fn charge_returning_nan(store: &Store, key: &str, charges: &Runs) -> Result<f64, AppError> {
    step("charge", async {
        charges.hit();
        Ok::<_, AppError>(f64::NAN)
    })
    .await
}

/// A holder that has learned its key was taken over does not start a step's effect:
/// the new holder runs it, once.
pub async fn a_step_does_not_start_once_the_lease_is_lost(store: &Store) {
    let faulty = FaultyStore::new(store);
    // The claim is slowed past a third of the lease, as a loaded machine slows it: the
    // call renews before the body, and that renewal must not meet the fault.
    faulty.inject(Op::Claim, Fault::Delay(Duration::from_millis(150)), 1);
    let shared = faulty.shared();
    let key = unique("steps-lost");
    let (charges, texts) = (
        std::sync::Arc::new(Runs::default()),
        std::sync::Arc::new(Runs::default()),
    );
    let first = {
        let (shared, key, charges, texts) = (shared.clone(), key.clone(), charges.clone(), texts.clone());
        tokio::spawn(async move { charge_then_sms_after_losing(&shared, &key, &charges, &texts, true).await })
    };
    // Once the body has charged, renewals fail, the 300 ms lease lapses, and another
    // call takes the key over.
    charges.started("the first holder's charge").await;
    faulty.inject(Op::Renew, Fault::Fail, u32::MAX);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let taken = charge_then_sms_after_losing(store, &key, &charges, &texts, false)
        .await
        .unwrap();
    assert_eq!(taken, "charge 1 sms 1", "the new holder replayed the charge and texted");
    faulty.heal();
    let ended = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the first holder learned that its lease was lost")
        .unwrap();
    let error = ended.unwrap_err().idem();
    assert!(matches!(error, Error::LeaseLost { .. }), "{error:?}");
    assert_eq!(
        (charges.count(), texts.count()),
        (1, 1),
        "the holder that lost its lease did not start its next step"
    );
}

/// A step whose effect ran but whose value cannot be recorded is recorded as having
/// run: the next attempt fails instead of running the effect again.
pub async fn a_step_value_that_cannot_be_recorded_is_not_run_again(store: &Store) {
    let key = unique("steps-nan");
    let charges = Runs::default();
    let first = charge_returning_nan(store, &key, &charges).await.unwrap_err().idem();
    assert!(matches!(first, Error::Encode { .. }), "{first:?}");
    for _ in 0..2 {
        let again = charge_returning_nan(store, &key, &charges).await.unwrap_err().idem();
        match &again {
            Error::InvalidStep { step, reason } => {
                assert_eq!(step, "charge");
                assert!(reason.contains("could not be recorded"), "{reason}");
            }
            other => panic!("expected InvalidStep, got {other:?}"),
        }
    }
    assert_eq!(charges.count(), 1, "the charge ran once");
}
