//! Model-based property tests: random sequences of claim / renew / complete / fail /
//! release / purge / clock advance, applied to every store and to a small reference
//! model of DESIGN §3 written here from the text (not from the stores' code). After
//! every step the store and the model agree on the step's answer and on every record.
//!
//! `IDEM_MODEL_CASES` sets the number of sequences per store (64 by default; the
//! documented long run uses 5,000).

mod conformance;
mod harness;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem::{Claim, ClaimOutcome, FenceCheck, IdempotencyStore, Lease, Record, Status};
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
}

fn op() -> impl Strategy<Value = Op> {
    let ms = 1..4_000u64;
    prop_oneof![
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

#[derive(Default)]
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
            // A new record's fence is its claim's instant in microseconds: above every
            // fence of the key's earlier lives.
            fence: existing.map_or_else(|| micros(now), |r| r.fence + 1),
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

/// Apply `ops` to `store` (empty, namespace `biz`) and to the model, step by step.
async fn agree(store: &dyn IdempotencyStore, biz: &str, ops: &[Op]) {
    let mut model = Model::default();
    let mut now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut leases: Vec<Lease> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        let at = |what: &str| format!("step {step} {op:?}: {what}");
        match op {
            Op::Claim {
                key,
                fingerprint,
                lease,
                ttl,
            } => {
                let (key, fingerprint) = (KEYS[*key], fingerprint.map(|f| FINGERPRINTS[f]));
                let (lease, ttl) = (Duration::from_millis(*lease), Duration::from_millis(*ttl));
                let claim = Claim::new(biz, key, now, lease, ttl).with_fingerprint(fingerprint);
                let expected = model.claim(key, fingerprint, now, lease, ttl);
                match (store.claim(&claim).await.unwrap(), expected) {
                    (ClaimOutcome::Acquired(granted), Answer::Granted(fence, created_at)) => {
                        assert_eq!(
                            (granted.fence, granted.created_at),
                            (fence, created_at),
                            "{}",
                            at("grant")
                        );
                        leases.push(granted);
                    }
                    (ClaimOutcome::Existing(record), Answer::Stands(expected)) => {
                        assert_eq!(observed(&record), expected, "{}", at("existing record"))
                    }
                    (got, expected) => panic!("{}: store {got:?}, model {expected:?}", at("claim")),
                }
            }
            Op::Renew { holder, lease } if !leases.is_empty() => {
                let held = &leases[holder % leases.len()];
                let until = now + Duration::from_millis(*lease);
                let expected = model.write(held, |r| {
                    r.lease_until = Some(until);
                    r.expires_at = r.expires_at.max(until);
                });
                let got = store.renew(held, now, Duration::from_millis(*lease)).await.unwrap();
                assert_eq!(got, expected, "{}", at("renew"));
            }
            Op::Complete { holder, ttl } if !leases.is_empty() => {
                let held = &leases[holder % leases.len()];
                let response = format!("\"response at step {step}\"");
                let expires = now + Duration::from_millis(*ttl);
                let expected = model.write(held, |r| {
                    (r.status, r.response) = (Status::Succeeded, Some(response.clone()));
                    (r.lease_until, r.completed_at, r.expires_at) = (Some(now), Some(now), expires);
                });
                let got = store
                    .complete(held, &response, now, Duration::from_millis(*ttl))
                    .await
                    .unwrap();
                assert_eq!(got, expected, "{}", at("complete"));
            }
            Op::Fail { holder, ttl } if !leases.is_empty() => {
                let held = &leases[holder % leases.len()];
                let message = format!("failed at step {step}");
                let expires = now + Duration::from_millis(*ttl);
                let expected = model.write(held, |r| {
                    (r.status, r.error) = (Status::Failed, Some(message.clone()));
                    (r.lease_until, r.completed_at, r.expires_at) = (Some(now), Some(now), expires);
                });
                let got = store
                    .fail(held, &message, now, Duration::from_millis(*ttl))
                    .await
                    .unwrap();
                assert_eq!(got, expected, "{}", at("fail"));
            }
            Op::Release { holder } if !leases.is_empty() => {
                let held = leases[holder % leases.len()].clone();
                let expected = match model.held(&held) {
                    Some(_) => {
                        model.records.remove(&held.key);
                        FenceCheck::Held
                    }
                    None => FenceCheck::Lost,
                };
                assert_eq!(store.release(&held).await.unwrap(), expected, "{}", at("release"));
            }
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
            _ => {} // a holder write before any claim was granted
        }
        for key in KEYS {
            let got = store.get(biz, key).await.unwrap().map(|r| observed(&r));
            assert_eq!(got.as_ref(), model.records.get(key), "{}", at(&format!("record {key}")));
        }
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
            agree(&*store, "model", &ops).await;
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
        Arc::new(idem::MemoryStore::new()) as Arc<dyn IdempotencyStore>
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
            let store = idem::sqlx::open_table(&url, "idem_model").await.unwrap();
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
