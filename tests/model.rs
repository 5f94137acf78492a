//! Model-based property tests: random sequences of claim / renew / complete / fail /
//! release / purge / clock advance, applied to every store and to a small reference
//! model of DESIGN §3 written here from the text (not from the stores' code). After
//! every step the store and the model agree on the step's answer and on every record.
//!
//! Two kinds of step test more than one call at a time: a *fault* step fails one store
//! call, either before it reaches the store or after its write committed (the reply
//! lost), and the model applies the write or not accordingly; a *together* step runs
//! two holder operations concurrently, and the store must agree with the model run in
//! one order or the other (each answer and every record).
//!
//! `IDEM_MODEL_CASES` sets the number of sequences per store (64 by default; the
//! documented long run uses 5,000).

use idem_testkit::conformance;
use idem_testkit::harness;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conformance::faulty::{Fault, FaultyStore};
use idem::store::{Claim, ClaimOutcome, FenceCheck, Lease};
use idem::{IdempotencyStore, Record, Status};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const KEYS: [&str; 3] = ["a", "b", "c"];
const FINGERPRINTS: [&str; 2] = ["f1", "f2"];

#[derive(Debug, Clone)]
enum Op {
    Claim {
        key: usize,
        fingerprint: Option<usize>,
        lease: u64,
        ttl: u64,
    },
    Renew {
        holder: usize,
        lease: u64,
    },
    Complete {
        holder: usize,
        ttl: u64,
    },
    Fail {
        holder: usize,
        ttl: u64,
    },
    Release {
        holder: usize,
    },
    Purge {
        limit: u64,
    },
    Advance {
        ms: u64,
    },
    /// One call of the operation fails: before the store, or after its write committed.
    Faulty(Box<Op>, Injected),
    /// Two operations at once.
    Together(Box<Op>, Box<Op>),
}

/// Where an injected fault strikes.
#[derive(Debug, Clone, Copy)]
enum Injected {
    /// The call never reaches the store.
    Before,
    /// The store's write commits; the reply is lost.
    AfterCommit,
}

/// A claim or a holder write: what can fail or run beside another.
fn call() -> impl Strategy<Value = Op> {
    let ms = 1..4_000u64;
    prop_oneof![
        2 => (0..KEYS.len(), proptest::option::of(0..FINGERPRINTS.len()), ms.clone(), ms.clone())
            .prop_map(|(key, fingerprint, lease, ttl)| Op::Claim { key, fingerprint, lease, ttl }),
        1 => (0..8usize, ms.clone()).prop_map(|(holder, lease)| Op::Renew { holder, lease }),
        1 => (0..8usize, ms.clone()).prop_map(|(holder, ttl)| Op::Complete { holder, ttl }),
        1 => (0..8usize, ms.clone()).prop_map(|(holder, ttl)| Op::Fail { holder, ttl }),
        1 => (0..8usize).prop_map(|holder| Op::Release { holder }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let ms = 1..4_000u64;
    let injected = prop_oneof![Just(Injected::Before), Just(Injected::AfterCommit)];
    prop_oneof![
        1 => (call(), injected).prop_map(|(op, fault)| Op::Faulty(Box::new(op), fault)),
        1 => (call(), call()).prop_map(|(a, b)| Op::Together(Box::new(a), Box::new(b))),
        4 => (0..KEYS.len(), proptest::option::of(0..FINGERPRINTS.len()), ms.clone(), ms.clone())
            .prop_map(|(key, fingerprint, lease, ttl)| Op::Claim { key, fingerprint, lease, ttl }),
        2 => (0..8usize, ms.clone()).prop_map(|(holder, lease)| Op::Renew { holder, lease }),
        2 => (0..8usize, ms.clone()).prop_map(|(holder, ttl)| Op::Complete { holder, ttl }),
        1 => (0..8usize, ms.clone()).prop_map(|(holder, ttl)| Op::Fail { holder, ttl }),
        1 => (0..8usize).prop_map(|holder| Op::Release { holder }),
        1 => (1..4u64).prop_map(|limit| Op::Purge { limit }),
        3 => (0..5_000u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// A record as DESIGN §3 and §5 describe it.
#[derive(Debug, Clone, PartialEq)]
struct Expected {
    status: Status,
    fence: u64,
    fingerprint: Option<String>,
    response: Option<String>,
    error: Option<String>,
    lease_until: Option<SystemTime>,
    created_at: SystemTime,
    completed_at: Option<SystemTime>,
    expires_at: SystemTime,
}

/// The model's answer to a claim.
#[derive(Debug)]
enum Answer {
    /// Granted with this fence, in the record's life begun at this instant.
    Granted(u64, SystemTime),
    /// Refused: this record stands.
    Stands(Expected),
}

#[derive(Default, Clone)]
struct Model {
    records: BTreeMap<String, Expected>,
}

impl Model {
    fn claim(
        &mut self,
        key: &str,
        fingerprint: Option<&str>,
        now: SystemTime,
        lease: Duration,
        ttl: Duration,
    ) -> Answer {
        let existing = self.records.get(key);
        let expired = existing.is_some_and(|r| r.expires_at <= now);
        let lapsed = existing.is_some_and(|r| {
            r.status == Status::Processing
                && r.lease_until.is_some_and(|until| until <= now)
                && match (&r.fingerprint, fingerprint) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        });
        if let Some(record) = existing {
            if !expired && !lapsed {
                return Answer::Stands(record.clone());
            }
        }
        let takeover = existing.filter(|_| !expired);
        let record = Expected {
            status: Status::Processing,
            // A new record's (or a new life's) fence is its claim's instant in
            // microseconds, or one above the last life's when that is higher; a
            // takeover adds one.
            fence: match existing {
                None => micros(now),
                Some(r) if expired => (r.fence + 1).max(micros(now)),
                Some(r) => r.fence + 1,
            },
            fingerprint: fingerprint
                .map(str::to_owned)
                .or_else(|| takeover.and_then(|r| r.fingerprint.clone())),
            response: None,
            error: None,
            lease_until: Some(now + lease),
            created_at: takeover.map_or(now, |r| r.created_at),
            completed_at: None,
            expires_at: now + ttl.max(lease),
        };
        let granted = Answer::Granted(record.fence, record.created_at);
        self.records.insert(key.to_owned(), record);
        granted
    }

    fn held(&mut self, lease: &Lease) -> Option<&mut Expected> {
        self.records
            .get_mut(&lease.key)
            .filter(|r| r.status == Status::Processing && r.fence == lease.fence && r.created_at == lease.created_at)
    }

    fn write(&mut self, lease: &Lease, change: impl FnOnce(&mut Expected)) -> FenceCheck {
        match self.held(lease) {
            Some(record) => {
                change(record);
                FenceCheck::Held
            }
            None => FenceCheck::Lost,
        }
    }

    fn purgeable(&self, now: SystemTime) -> Vec<String> {
        self.records
            .iter()
            .filter(|(_, r)| {
                r.expires_at <= now
                    && (r.status != Status::Processing || r.lease_until.is_some_and(|until| until <= now))
            })
            .map(|(key, _)| key.clone())
            .collect()
    }
}

fn observed(record: &Record) -> Expected {
    Expected {
        status: record.status,
        fence: record.fence,
        fingerprint: record.fingerprint.clone(),
        response: record.response_body.clone(),
        error: record.error_message.clone(),
        lease_until: record.lease_until,
        created_at: record.created_at,
        completed_at: record.completed_at,
        expires_at: record.expires_at,
    }
}

/// What one operation answered, as the model predicts it and as the store gives it.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Granted(u64, SystemTime),
    Stands(Expected),
    Fence(FenceCheck),
    /// The call failed (an injected fault).
    Failed,
    /// A holder write before any claim was granted: nothing to do.
    Skipped,
}

/// What a step works with besides the model and the store.
struct Step<'a> {
    biz: &'a str,
    now: SystemTime,
    leases: &'a [Lease],
    number: usize,
}

impl Step<'_> {
    fn holder(&self, holder: usize) -> Option<&Lease> {
        (!self.leases.is_empty()).then(|| &self.leases[holder % self.leases.len()])
    }

    fn claim<'c>(&'c self, key: usize, fingerprint: Option<usize>, lease: u64, ttl: u64) -> Claim<'c> {
        let (lease, ttl) = (Duration::from_millis(lease), Duration::from_millis(ttl));
        Claim::new(self.biz, KEYS[key], self.now, lease, ttl).with_fingerprint(fingerprint.map(|f| FINGERPRINTS[f]))
    }

    fn response(&self) -> String {
        format!("\"response at step {}\"", self.number)
    }

    fn message(&self) -> String {
        format!("failed at step {}", self.number)
    }

    /// The model's answer to `op` (a claim or a holder write), applied to `model`.
    fn predict(&self, model: &mut Model, op: &Op) -> Outcome {
        let now = self.now;
        match op {
            Op::Claim {
                key,
                fingerprint,
                lease,
                ttl,
            } => {
                let claim = self.claim(*key, *fingerprint, *lease, *ttl);
                match model.claim(claim.key, claim.fingerprint, now, claim.lease, claim.ttl) {
                    Answer::Granted(fence, created_at) => Outcome::Granted(fence, created_at),
                    Answer::Stands(record) => Outcome::Stands(record),
                }
            }
            Op::Renew { holder, lease } => self.holder(*holder).map_or(Outcome::Skipped, |held| {
                let until = now + Duration::from_millis(*lease);
                Outcome::Fence(model.write(held, |r| {
                    r.lease_until = Some(until);
                    r.expires_at = r.expires_at.max(until);
                }))
            }),
            Op::Complete { holder, ttl } => self.holder(*holder).map_or(Outcome::Skipped, |held| {
                let (response, expires) = (self.response(), now + Duration::from_millis(*ttl));
                Outcome::Fence(model.write(held, |r| {
                    (r.status, r.response) = (Status::Succeeded, Some(response));
                    (r.lease_until, r.completed_at, r.expires_at) = (Some(now), Some(now), expires);
                }))
            }),
            Op::Fail { holder, ttl } => self.holder(*holder).map_or(Outcome::Skipped, |held| {
                let (message, expires) = (self.message(), now + Duration::from_millis(*ttl));
                Outcome::Fence(model.write(held, |r| {
                    (r.status, r.error) = (Status::Failed, Some(message));
                    (r.lease_until, r.completed_at, r.expires_at) = (Some(now), Some(now), expires);
                }))
            }),
            Op::Release { holder } => self.holder(*holder).map_or(Outcome::Skipped, |held| {
                Outcome::Fence(match model.held(held) {
                    Some(_) => {
                        model.records.remove(&held.key);
                        FenceCheck::Held
                    }
                    None => FenceCheck::Lost,
                })
            }),
            Op::Faulty(op, Injected::Before) => match self.predict(&mut model.clone(), op) {
                Outcome::Skipped => Outcome::Skipped,
                _ => Outcome::Failed,
            },
            Op::Faulty(op, Injected::AfterCommit) => match self.predict(model, op) {
                Outcome::Skipped => Outcome::Skipped,
                _ => Outcome::Failed,
            },
            other => unreachable!("not a call: {other:?}"),
        }
    }

    /// The store's answer to `op` (a claim or a holder write).
    async fn perform(&self, store: &FaultyStore, op: &Op) -> Outcome {
        let now = self.now;
        let fenced =
            |answer: Result<FenceCheck, idem::store::StoreError>| answer.map_or(Outcome::Failed, Outcome::Fence);
        match op {
            Op::Claim {
                key,
                fingerprint,
                lease,
                ttl,
            } => match store.claim(&self.claim(*key, *fingerprint, *lease, *ttl)).await {
                Ok(ClaimOutcome::Acquired(granted)) => Outcome::Granted(granted.fence, granted.created_at),
                Ok(ClaimOutcome::Existing(record)) => Outcome::Stands(observed(&record)),
                Err(_) => Outcome::Failed,
            },
            Op::Renew { holder, lease } => match self.holder(*holder) {
                Some(held) => fenced(store.renew(held, now, Duration::from_millis(*lease)).await),
                None => Outcome::Skipped,
            },
            Op::Complete { holder, ttl } => match self.holder(*holder) {
                Some(held) => fenced(
                    store
                        .complete(held, &self.response(), now, Duration::from_millis(*ttl))
                        .await,
                ),
                None => Outcome::Skipped,
            },
            Op::Fail { holder, ttl } => match self.holder(*holder) {
                Some(held) => fenced(
                    store
                        .fail(held, &self.message(), now, Duration::from_millis(*ttl))
                        .await,
                ),
                None => Outcome::Skipped,
            },
            Op::Release { holder } => match self.holder(*holder) {
                Some(held) => fenced(store.release(held).await),
                None => Outcome::Skipped,
            },
            Op::Faulty(op, injected) => {
                let fault = match injected {
                    Injected::Before => Fault::Fail,
                    Injected::AfterCommit => Fault::CommitThenFail,
                };
                store.inject(FaultOp::of(op), fault, 1);
                let outcome = Box::pin(self.perform(store, op)).await;
                store.heal(); // a skipped call left its fault unmet
                outcome
            }
            other => unreachable!("not a call: {other:?}"),
        }
    }
}

/// The store operation a call makes.
struct FaultOp;

impl FaultOp {
    fn of(op: &Op) -> conformance::faulty::Op {
        use conformance::faulty::Op as Call;
        match op {
            Op::Claim { .. } => Call::Claim,
            Op::Renew { .. } => Call::Renew,
            Op::Complete { .. } => Call::Complete,
            Op::Fail { .. } => Call::Fail,
            Op::Release { .. } => Call::Release,
            other => unreachable!("not a call: {other:?}"),
        }
    }
}

/// The records of `biz`, as the store has them.
async fn records(store: &dyn IdempotencyStore, biz: &str) -> BTreeMap<String, Expected> {
    let mut records = BTreeMap::new();
    for key in KEYS {
        if let Some(record) = store.get(biz, key).await.unwrap() {
            records.insert(key.to_owned(), observed(&record));
        }
    }
    records
}

/// Apply `ops` to `store` (empty, namespace `biz`) and to the model, step by step.
async fn agree(inner: &Arc<dyn IdempotencyStore>, biz: &str, ops: &[Op]) {
    let store = FaultyStore::new(inner);
    let mut model = Model::default();
    let mut now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut leases: Vec<Lease> = Vec::new();
    for (number, op) in ops.iter().enumerate() {
        let at = |what: &str| format!("step {number} {op:?}: {what}");
        let step = Step {
            biz,
            now,
            leases: &leases,
            number,
        };
        let mut granted = Vec::new();
        match op {
            Op::Purge { limit } => {
                let eligible = model.purgeable(now);
                let purged = store.purge_expired(now, *limit).await.unwrap();
                assert_eq!(purged, (*limit).min(eligible.len() as u64), "{}", at("purge count"));
                // Which of the eligible records went is the store's choice; follow it.
                for key in eligible {
                    if store.get(biz, &key).await.unwrap().is_none() {
                        model.records.remove(&key);
                    }
                }
            }
            Op::Advance { ms } => now += Duration::from_millis(*ms),
            Op::Together(a, b) => {
                let (got_a, got_b) = tokio::join!(step.perform(&store, a), step.perform(&store, b));
                let stored = records(inner.as_ref(), biz).await;
                let orders = [(a, b, false), (b, a, true)].map(|(first, second, swapped)| {
                    let mut model = model.clone();
                    let one = step.predict(&mut model, first);
                    let two = step.predict(&mut model, second);
                    let answers = if swapped { (two, one) } else { (one, two) };
                    (answers, model)
                });
                let agreed = orders
                    .into_iter()
                    .find(|((a, b), order)| (a, b) == (&got_a, &got_b) && order.records == stored);
                let Some((_, order)) = agreed else {
                    panic!(
                        "{}: store answered {got_a:?} / {got_b:?} with {stored:?}, which no order of the two gives",
                        at("together")
                    )
                };
                model = order;
                granted.extend([(got_a, &**a), (got_b, &**b)]);
            }
            call => {
                let expected = step.predict(&mut model, call);
                let got = step.perform(&store, call).await;
                assert_eq!(got, expected, "{}", at("answer"));
                granted.push((got, call));
            }
        }
        for (outcome, call) in granted {
            if let (Outcome::Granted(fence, created_at), Op::Claim { key, .. }) = (outcome, call) {
                leases.push(Lease::new(biz, KEYS[*key], fence, created_at));
            }
        }
        assert_eq!(records(inner.as_ref(), biz).await, model.records, "{}", at("records"));
    }
}

fn cases() -> u32 {
    std::env::var("IDEM_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Run the property on stores from `open` (each sequence on an empty one).
fn check<F, Fut>(name: &str, open: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn IdempotencyStore>>,
{
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let sequences = proptest::collection::vec(op(), 1..40);
    let result = runner.run(&sequences, |ops| {
        runtime.block_on(async {
            let store = open().await;
            agree(&store, "model", &ops).await;
        });
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{name} disagrees with the model: {failure}");
    }
    harness::say(&format!(
        "model on {name}: {} random sequences of up to 39 steps agree",
        cases()
    ));
}

#[test]
fn memory_store_agrees_with_the_model() {
    check("memory", || async {
        // The model moves time by the instants it passes.
        Arc::new(idem::MemoryStore::new().with_lease_clock(idem::LeaseClock::Caller)) as Arc<dyn IdempotencyStore>
    });
}

/// A SQL store on the table `idem_model`, emptied before each sequence.
fn check_sql(backend: &str) {
    let Some(url) = harness::backend_url(backend, "model") else {
        return;
    };
    check(backend, || {
        let url = url.clone();
        async move {
            // The model moves time by the instants it passes: the store judges by them.
            let store = idem::sql::OpenOptions::new()
                .table("idem_model")
                .lease_clock(idem::LeaseClock::Caller)
                .open(&url)
                .await
                .unwrap();
            harness::Effects::open(&url)
                .await
                .execute("DELETE FROM idem_model", &[])
                .await
                .unwrap();
            store
        }
    });
}

#[test]
fn sqlite_store_agrees_with_the_model() {
    check_sql("sqlite");
}

#[test]
fn postgres_store_agrees_with_the_model() {
    check_sql("postgres");
}

#[test]
fn mysql_store_agrees_with_the_model() {
    check_sql("mysql");
}

fn micros(at: SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}
