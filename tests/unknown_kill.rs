//! Effects whose outcome is unknown, on every store: a worker is SIGKILLed between a
//! step's effect (a charge at a bank that never deduplicates: one business row per
//! request) and its record, and the retry must not charge again. With `reconcile` the
//! retry asks the bank once and keeps the killed worker's charge; with `fail_closed`
//! every call gets `Error::OutcomeUnknown` until an operator settles the record, after
//! which the next call replays the settled value (or runs, for "not done"). A bank that
//! charges and never answers (a timeout) is reconciled in the same call. Without a
//! policy the retry charges twice: the window these policies close.
//!
//! The memory store lives in one process: there the holder "dies" as its task is
//! aborted mid-effect, which drops its heartbeat as a kill does.

use idem_testkit::conformance;
use idem_testkit::harness;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use harness::{AppError, Effects};
use idem::repair::{self, Settle, Settlement};
use idem::{idempotent, Error, IdempotencyStore, Lookup, Step};

type Store = Arc<dyn IdempotencyStore>;

/// What a step does when it finds its effect begun and not finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Rerun,
    Reconcile,
    FailClosed,
    /// `on_takeover = reconcile(..)`: the whole body is the charge.
    WholeReconcile,
    /// `on_takeover = fail_closed`.
    WholeFailClosed,
}

/// Where the holder stops (to be killed), or how the bank answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hang {
    /// Charge and answer.
    No,
    /// Stop after the intent, before the charge.
    BeforeCharge,
    /// Stop after the charge, before its answer is recorded.
    AfterCharge,
    /// Charge, then fail as a timeout would: the answer never came.
    TimeOut,
}

impl Policy {
    fn parse(text: &str) -> Self {
        match text {
            "rerun" => Policy::Rerun,
            "reconcile" => Policy::Reconcile,
            "whole-reconcile" => Policy::WholeReconcile,
            "whole-fail-closed" => Policy::WholeFailClosed,
            _ => Policy::FailClosed,
        }
    }
}

/// The bank: `charge` writes a row under the call's key each time it is asked (it never
/// deduplicates), the charge's reference being the step's effect key; `charged` says
/// whether it charged a reference, and with what.
struct Bank {
    rows: Effects,
    run: String,
}

impl Bank {
    async fn charge(&self, key: &str, reference: &str) -> Result<String, AppError> {
        let charge = format!("{reference} by {}", std::process::id());
        self.rows.record(&self.run, key, &charge).await?;
        Ok(charge)
    }

    async fn charges(&self, key: &str) -> Vec<String> {
        self.rows.tokens(&self.run).await.remove(key).unwrap_or_default()
    }

    async fn charged(&self, key: &str, reference: &str) -> Lookup<String> {
        match self
            .charges(key)
            .await
            .into_iter()
            .find(|charge| charge.starts_with(reference))
        {
            Some(charge) => Lookup::Done(charge),
            None => Lookup::NotDone,
        }
    }
}

/// One charge at the bank under `reference`, stopping (or failing) where `hang` says.
async fn charge(bank: &Bank, key: &str, reference: &str, hang: Hang) -> Result<String, AppError> {
    if hang == Hang::BeforeCharge {
        harness::report("STOPPED");
        tokio::time::sleep(Duration::from_secs(600)).await;
    }
    let charge = bank.charge(key, reference).await?;
    match hang {
        Hang::AfterCharge => {
            harness::report("STOPPED");
            tokio::time::sleep(Duration::from_secs(600)).await;
        }
        Hang::TimeOut => return Err(AppError::Effect(idem::sqlx::Error::PoolTimedOut)),
        _ => {}
    }
    Ok(charge)
}

/// The body: one charge at the bank, as a step under `policy` (or, for the whole-body
/// policies, the body itself is the charge: see [`pay_whole`]).
async fn pay(
    store: &Store,
    bank: &Bank,
    key: &str,
    policy: Policy,
    hang: Hang,
    lookups: &AtomicUsize,
) -> Result<String, AppError> {
    match policy {
        Policy::WholeReconcile => pay_whole_reconciled(store, bank, key, hang, lookups).await,
        Policy::WholeFailClosed => pay_whole_failing_closed(store, bank, key, hang).await,
        _ => pay_in_a_step(store, bank, key, policy, hang, lookups).await,
    }
}

#[idempotent(key = key, biz = "unknown.kill", store = store, lease = "1s", wait = "20s")]
async fn pay_in_a_step(
    store: &Store,
    bank: &Bank,
    key: &str,
    policy: Policy,
    hang: Hang,
    lookups: &AtomicUsize,
) -> Result<String, AppError> {
    let reference = idem::context().expect("inside the body").effect_key("charge");
    let step = Step::new("charge");
    let step = match policy {
        Policy::FailClosed => step.fail_closed(),
        Policy::Reconcile => step.reconcile(|intent| async move {
            lookups.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(bank.charged(key, &intent.effect_key).await)
        }),
        _ => step,
    };
    step.run(charge(bank, key, &reference, hang)).await
}

/// A body that is one bank call, its reference the record's life key: a takeover asks
/// the bank whether it charged.
#[idempotent(key = key, biz = "unknown.kill", store = store, lease = "1s", wait = "20s",
    on_takeover = reconcile(|intent: idem::Intent| async move {
        lookups.fetch_add(1, Ordering::SeqCst);
        Ok::<_, AppError>(bank.charged(key, &intent.effect_key).await)
    }))]
async fn pay_whole_reconciled(
    store: &Store,
    bank: &Bank,
    key: &str,
    hang: Hang,
    lookups: &AtomicUsize,
) -> Result<String, AppError> {
    let reference = idem::context().expect("inside the body").life_key();
    charge(bank, key, &reference, hang).await
}

/// The same body, failing closed on a takeover.
#[idempotent(key = key, biz = "unknown.kill", store = store, lease = "1s", wait = "20s", on_takeover = fail_closed)]
async fn pay_whole_failing_closed(store: &Store, bank: &Bank, key: &str, hang: Hang) -> Result<String, AppError> {
    let reference = idem::context().expect("inside the body").life_key();
    charge(bank, key, &reference, hang).await
}

/// The worker: one call of `pay` that stops where `UNKNOWN_HANG` says, to be killed.
#[test]
fn unknown_worker() {
    let Some(_) = harness::worker_settings("unknown") else {
        return;
    };
    let url = harness::setting("UNKNOWN_URL");
    let hang = match harness::setting("UNKNOWN_HANG").as_str() {
        "before" => Hang::BeforeCharge,
        _ => Hang::AfterCharge,
    };
    let policy = Policy::parse(&harness::setting("UNKNOWN_POLICY"));
    harness::worker_runtime().block_on(async {
        let store = harness::open_store(&url).await;
        let bank = Bank {
            rows: Effects::open(&url).await,
            run: harness::setting("UNKNOWN_RUN"),
        };
        let _ = pay(
            &store,
            &bank,
            &harness::setting("UNKNOWN_KEY"),
            policy,
            hang,
            &AtomicUsize::new(0),
        )
        .await;
        unreachable!("the worker stops to be killed");
    });
}

/// One store and its bank.
struct Bench {
    backend: &'static str,
    url: String,
    store: Store,
    bank: Bank,
}

impl Bench {
    async fn open(backend: &'static str) -> Option<Bench> {
        let run = conformance::unique("unknown");
        let (url, store) = if backend == "memory" {
            let url = harness::backend_url("sqlite", "unknown-bank")?;
            (url, Arc::new(idem::MemoryStore::new()) as Store)
        } else {
            let url = harness::backend_url(backend, "unknown")?;
            let store = harness::open_store(&url).await;
            (url, store)
        };
        let bank = Bank {
            rows: Effects::open(&url).await,
            run,
        };
        Some(Bench {
            backend,
            url,
            store,
            bank,
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}-{name}", self.bank.run)
    }

    /// Settle `key`'s `step` (the body: `""`) as `settlement`, which must settle it.
    async fn settle(&self, key: &str, step: &str, settlement: Settlement) {
        let settled = repair::settle(&*self.store, "unknown.kill", key, step, settlement)
            .await
            .unwrap();
        assert!(
            matches!(settled, Settle::Settled { .. }),
            "{}: {settled:?}",
            self.backend
        );
    }

    /// The keys the store lists as unsettled (what `idem unknown` prints); `None` for
    /// the memory store, which has no listing.
    async fn listed(&self) -> Option<Vec<String>> {
        let biz = Some("unknown.kill");
        let records = if self.backend == "memory" {
            return None;
        } else if self.backend == "redis" {
            let redis = idem::RedisStore::connect(&self.url).await.unwrap();
            redis.unsettled(biz, 1000).await.unwrap()
        } else {
            let any = self.store.as_any().expect("a SQL store");
            if let Some(store) = any.downcast_ref::<idem::SqliteStore>() {
                store.unsettled(biz, 1000).await.unwrap()
            } else if let Some(store) = any.downcast_ref::<idem::PostgresStore>() {
                store.unsettled(biz, 1000).await.unwrap()
            } else {
                let store = any.downcast_ref::<idem::MySqlStore>().expect("a MySQL store");
                store.unsettled(biz, 1000).await.unwrap()
            }
        };
        Some(records.into_iter().map(|record| record.key).collect())
    }

    /// The bank charged `key` once, and `answer` is that charge.
    async fn charged_once(&self, key: &str, answer: &str, what: &str) {
        assert_eq!(
            self.bank.charges(key).await,
            vec![answer.to_owned()],
            "{}: {what}",
            self.backend
        );
    }

    /// The bank charged `key` `times`, or the test fails saying `what`.
    async fn charged(&self, key: &str, times: usize, what: &str) {
        let charges = self.bank.charges(key).await;
        assert_eq!(charges.len(), times, "{}: {what}: {charges:?}", self.backend);
    }

    /// A holder that stops where `hang` says under `policy`, and dies there: a worker
    /// process SIGKILLed, or (memory) a task aborted.
    async fn kill_holder(&self, key: &str, policy: Policy, hang: Hang) {
        if self.backend == "memory" {
            let (store, owned) = (self.store.clone(), key.to_owned());
            let bank = Bank {
                rows: self.bank.rows.clone(),
                run: self.bank.run.clone(),
            };
            let charged = self.bank.charges(key).await.len();
            let holder = tokio::spawn(async move {
                let _ = pay(&store, &bank, &owned, policy, hang, &AtomicUsize::new(0)).await;
            });
            // Stopped where it stops: past its intent, and past the charge if it charges.
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let steps = self
                    .store
                    .get("unknown.kill", key)
                    .await
                    .unwrap()
                    .and_then(|record| record.steps);
                let intended = policy == Policy::Rerun || steps.is_some_and(|steps| steps.contains("?intent"));
                let stopped = hang == Hang::BeforeCharge || self.bank.charges(key).await.len() > charged;
                if intended && stopped {
                    break;
                }
            }
            holder.abort();
            let _ = holder.await;
            return;
        }
        let settings = [
            ("UNKNOWN_URL", self.url.clone()),
            ("UNKNOWN_RUN", self.bank.run.clone()),
            ("UNKNOWN_KEY", key.to_owned()),
            (
                "UNKNOWN_HANG",
                if hang == Hang::BeforeCharge { "before" } else { "after" }.to_owned(),
            ),
            (
                "UNKNOWN_POLICY",
                match policy {
                    Policy::Rerun => "rerun",
                    Policy::Reconcile => "reconcile",
                    Policy::FailClosed => "fail-closed",
                    Policy::WholeReconcile => "whole-reconcile",
                    Policy::WholeFailClosed => "whole-fail-closed",
                }
                .to_owned(),
            ),
        ];
        let (mut child, _, _) = harness::start_worker("unknown", "unknown_worker", &settings, "STOPPED");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    async fn pay(&self, key: &str, policy: Policy, hang: Hang, lookups: &AtomicUsize) -> Result<String, AppError> {
        pay(&self.store, &self.bank, key, policy, hang, lookups).await
    }
}

fn unknown(outcome: &Result<String, AppError>) -> bool {
    matches!(outcome, Err(AppError::Idem(Error::OutcomeUnknown { step: Some(step), .. })) if step == "charge")
}

/// Killed after the charge; retried with `reconcile`: the bank is asked once, the
/// killed worker's charge is the answer, and nobody is charged twice.
async fn reconciled_after_a_kill(bench: &Bench) {
    let key = bench.key("reconcile");
    bench.kill_holder(&key, Policy::Reconcile, Hang::AfterCharge).await;
    let lookups = AtomicUsize::new(0);
    let answer = bench.pay(&key, Policy::Reconcile, Hang::No, &lookups).await.unwrap();
    let again = bench.pay(&key, Policy::Reconcile, Hang::No, &lookups).await.unwrap();
    let charges = bench.bank.charges(&key).await;
    assert_eq!(charges.len(), 1, "{}: charged once: {charges:?}", bench.backend);
    assert_eq!(
        (&answer, &again),
        (&charges[0], &charges[0]),
        "{}: the answer is the first charge",
        bench.backend
    );
    assert_eq!(
        lookups.load(Ordering::SeqCst),
        1,
        "{}: one lookup for the one takeover",
        bench.backend
    );
}

/// Killed after the charge; retried with `fail_closed`: every call gets the unknown
/// outcome (nothing charges again, nothing takes the record over), the record lists as
/// unsettled, and once settled as done the next call replays the settled value.
async fn failed_closed_after_a_kill(bench: &Bench) {
    let key = bench.key("fail-closed");
    bench.kill_holder(&key, Policy::FailClosed, Hang::AfterCharge).await;
    let lookups = AtomicUsize::new(0);
    let fence = || async { bench.store.get("unknown.kill", &key).await.unwrap().unwrap().fence };
    let mut fences = Vec::new();
    for attempt in 0..3 {
        let outcome = bench.pay(&key, Policy::FailClosed, Hang::No, &lookups).await;
        assert!(
            unknown(&outcome),
            "{}: attempt {attempt} fails closed: {outcome:?}",
            bench.backend
        );
        fences.push(fence().await);
    }
    assert!(
        fences.windows(2).all(|pair| pair[0] == pair[1]),
        "{}: the duplicates did not take the unsettled record over: fences {fences:?}",
        bench.backend
    );
    // Freed by force, the record is taken over: its step still fails closed.
    repair::force_release(&*bench.store, "unknown.kill", &key)
        .await
        .unwrap();
    let outcome = bench.pay(&key, Policy::FailClosed, Hang::No, &lookups).await;
    assert!(
        unknown(&outcome),
        "{}: a forced release does not rerun the charge: {outcome:?}",
        bench.backend
    );
    let charges = bench.bank.charges(&key).await;
    assert_eq!(charges.len(), 1, "{}: never charged again: {charges:?}", bench.backend);
    let record = bench.store.get("unknown.kill", &key).await.unwrap().unwrap();
    let intent = idem::unknown::unsettled(&record).expect("the record is unsettled");
    if let Some(listed) = bench.listed().await {
        assert!(
            listed.contains(&key),
            "{}: `idem unknown` lists it: {listed:?}",
            bench.backend
        );
    }
    assert!(
        charges[0].starts_with(&intent.effect_key),
        "{}: the intent names the charge's reference",
        bench.backend
    );
    bench
        .settle(
            &key,
            "charge",
            Settlement::Done(serde_json::to_string(&charges[0]).unwrap()),
        )
        .await;
    if let Some(listed) = bench.listed().await {
        assert!(!listed.contains(&key), "{}: settled, no longer listed", bench.backend);
    }
    let answer = bench.pay(&key, Policy::FailClosed, Hang::No, &lookups).await.unwrap();
    assert_eq!(answer, charges[0], "{}: the settled value is replayed", bench.backend);
    bench.charged(&key, 1, "still one charge").await;
    assert!(matches!(
        repair::settle(&*bench.store, "unknown.kill", &key, "charge", Settlement::NotDone)
            .await
            .unwrap(),
        Settle::NotUnknown { .. }
    ));
}

/// Killed after its intent and before the charge; failed closed; settled as not done:
/// the next call charges, once.
async fn settled_not_done_runs(bench: &Bench) {
    let key = bench.key("not-done");
    bench.kill_holder(&key, Policy::FailClosed, Hang::BeforeCharge).await;
    let lookups = AtomicUsize::new(0);
    assert!(unknown(&bench.pay(&key, Policy::FailClosed, Hang::No, &lookups).await));
    assert!(bench.bank.charges(&key).await.is_empty());
    bench.settle(&key, "charge", Settlement::NotDone).await;
    let answer = bench.pay(&key, Policy::FailClosed, Hang::No, &lookups).await.unwrap();
    bench
        .charged_once(&key, &answer, "charged once, by the call after the settling")
        .await;
}

/// The bank charges and never answers: `reconcile` asks it in the same call and returns
/// the charge; `fail_closed` fails closed in the same call, and its duplicate too.
async fn a_timeout_is_settled_in_the_same_call(bench: &Bench) {
    let key = bench.key("timeout-reconcile");
    let lookups = AtomicUsize::new(0);
    let answer = bench
        .pay(&key, Policy::Reconcile, Hang::TimeOut, &lookups)
        .await
        .unwrap();
    bench.charged_once(&key, &answer, "one charge, returned").await;
    assert_eq!(lookups.load(Ordering::SeqCst), 1);
    let key = bench.key("timeout-fail-closed");
    assert!(unknown(
        &bench.pay(&key, Policy::FailClosed, Hang::TimeOut, &lookups).await
    ));
    assert!(unknown(&bench.pay(&key, Policy::FailClosed, Hang::No, &lookups).await));
    bench.charged(&key, 1, "the duplicate did not charge").await;
}

/// Without a policy, the retry charges again: the window itself, so that the tests
/// above are known to land their kill after the charge.
async fn without_a_policy_the_retry_charges_twice(bench: &Bench) {
    let key = bench.key("rerun");
    bench.kill_holder(&key, Policy::Rerun, Hang::AfterCharge).await;
    bench
        .pay(&key, Policy::Rerun, Hang::No, &AtomicUsize::new(0))
        .await
        .unwrap();
    bench.charged(&key, 2, "the rerun charged again").await;
}

/// A whole body (`on_takeover`) killed after its charge: reconciled once, or failed
/// closed until the body is settled (no step name), then replayed.
async fn whole_bodies_after_a_kill(bench: &Bench) {
    let key = bench.key("whole-reconcile");
    bench.kill_holder(&key, Policy::WholeReconcile, Hang::AfterCharge).await;
    let lookups = AtomicUsize::new(0);
    let answer = bench
        .pay(&key, Policy::WholeReconcile, Hang::No, &lookups)
        .await
        .unwrap();
    bench.charged_once(&key, &answer, "the body charged once").await;
    assert_eq!(lookups.load(Ordering::SeqCst), 1, "{}: one lookup", bench.backend);

    let key = bench.key("whole-fail-closed");
    bench
        .kill_holder(&key, Policy::WholeFailClosed, Hang::AfterCharge)
        .await;
    for _ in 0..2 {
        let outcome = bench.pay(&key, Policy::WholeFailClosed, Hang::No, &lookups).await;
        assert!(
            matches!(outcome, Err(AppError::Idem(Error::OutcomeUnknown { step: None, .. }))),
            "{}: the body fails closed: {outcome:?}",
            bench.backend
        );
    }
    let charges = bench.bank.charges(&key).await;
    assert_eq!(charges.len(), 1, "{}: not charged again: {charges:?}", bench.backend);
    let value = serde_json::to_string(&charges[0]).unwrap();
    bench.settle(&key, "", Settlement::Done(value)).await;
    let answer = bench
        .pay(&key, Policy::WholeFailClosed, Hang::No, &lookups)
        .await
        .unwrap();
    assert_eq!(answer, charges[0], "{}: the settled response", bench.backend);
    bench.charged(&key, 1, "the settled response charged nothing").await;
}

async fn every_scenario(backend: &'static str) {
    let Some(bench) = Bench::open(backend).await else {
        return;
    };
    reconciled_after_a_kill(&bench).await;
    failed_closed_after_a_kill(&bench).await;
    settled_not_done_runs(&bench).await;
    a_timeout_is_settled_in_the_same_call(&bench).await;
    without_a_policy_the_retry_charges_twice(&bench).await;
    whole_bodies_after_a_kill(&bench).await;
    harness::say(&format!(
        "unknown outcomes on {backend}: holders killed after the charge (a step, or a whole body) reconciled (1 lookup, 1 charge) or failed closed until settled; a timeout settled in the call; without a policy, 2 charges"
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_memory() {
    every_scenario("memory").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_sqlite() {
    every_scenario("sqlite").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_postgres() {
    every_scenario("postgres").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_mysql() {
    every_scenario("mysql").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_redis() {
    every_scenario("redis").await;
}

/// An operation that requires a policy refuses a step that declares none, before its
/// effect; a step with one runs.
#[tokio::test]
async fn an_operation_that_requires_a_policy_refuses_a_step_without_one() {
    let op = idem::Idempotent::new("unknown.required")
        .require_outcome_policy()
        .store(Arc::new(idem::MemoryStore::new()));
    let effects = AtomicUsize::new(0);
    let effect = || async {
        effects.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(1)
    };
    let refused = op.execute("k1", async { idem::step("charge", effect()).await }).await;
    assert!(
        matches!(&refused, Err(Error::InvalidStep { reason, .. }) if reason.contains("requires every step")),
        "{refused:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0, "the effect did not run");
    let ran: u32 = op
        .execute("k2", async { Step::new("charge").fail_closed().run(effect()).await })
        .await
        .unwrap();
    assert_eq!((ran, effects.load(Ordering::SeqCst)), (1, 1));
}

/// The attribute's `outcome_policy = required` is the builder's `require_outcome_policy`.
#[idempotent(key = key, biz = "unknown.required", store = store, outcome_policy = required)]
async fn charge_with_a_bare_step(store: &Store, key: &str) -> Result<u32, Error> {
    idem::step("charge", async { Ok::<_, Error>(1) }).await
}

#[tokio::test]
async fn the_attribute_can_require_a_policy_too() {
    let store: Store = Arc::new(idem::MemoryStore::new());
    let refused = charge_with_a_bare_step(&store, "k").await;
    assert!(matches!(refused, Err(Error::InvalidStep { .. })), "{refused:?}");
}
