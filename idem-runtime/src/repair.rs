//! An operator's repairs: freeing a claim whose holder is gone, settling an effect
//! whose outcome was unknown.
//!
//! A `PROCESSING` record whose lease still runs belongs to a body that is running (its
//! heartbeat keeps renewing the lease): freeing it would let the next call run the body
//! beside it. So [`release_stuck`] frees only a claim whose lease has lapsed, and does
//! it the way a retry would: it takes the claim over (the store grants that only while
//! the lease is lapsed, in one atomic step, so a holder that renewed meanwhile keeps
//! its claim) and then releases its own lease. The old holder is fenced out and its
//! writes change nothing. [`force_release`] frees a live claim too, for the operator
//! who knows its holder is gone; it says what it risks.

use std::time::{Duration, SystemTime};

use crate::claim::{Claim, ClaimOutcome, FenceCheck, Lease};
use crate::error::StoreError;
use crate::record::{Record, Status};
use crate::store::IdempotencyStore;
use crate::unknown::{Entry, UNSETTLED_LEASE};

/// How long the lease of a release's own takeover lasts: only until its release, which
/// follows at once (if that fails, the claim lapses again after this long).
const RELEASE_LEASE: Duration = Duration::from_secs(10);

/// What an operator's release came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Release {
    /// The claim was freed: the next call runs the body (with the recorded steps of
    /// this life, if any).
    Released {
        /// The fence the freed claim was held under.
        fence: u64,
    },
    /// No record of the key.
    NotFound,
    /// The record is finished, not a claim (`SUCCESS` or `FAIL`).
    Finished(Status),
    /// The claim's lease still runs: its holder is alive, or was alive until at most a
    /// lease ago. Nothing was changed.
    LeaseRunning {
        /// When the lease runs out, unless its holder renews it again.
        until: SystemTime,
        /// The fence of the running claim.
        fence: u64,
    },
}

/// Free the claim of `(biz, key)` if its lease has lapsed at `now`, so the next call
/// runs the body; a claim whose lease still runs is left alone
/// ([`Release::LeaseRunning`]). What `idem release` does.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use idem_runtime::{repair, Claim, IdempotencyStore, LeaseClock, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_runtime::StoreError> {
/// // This example moves time by the instants it passes: the store judges by them.
/// let store = MemoryStore::new().with_lease_clock(LeaseClock::Caller);
/// let now = SystemTime::now();
/// store.claim(&Claim::new("pay", "order-7", now, Duration::from_secs(30), Duration::from_secs(60))).await?;
/// // The lease runs: the holder may be working.
/// assert!(matches!(repair::release_stuck(&store, "pay", "order-7", now).await?, repair::Release::LeaseRunning { .. }));
/// // A minute later nobody renewed it: the holder is gone.
/// let later = now + Duration::from_secs(60);
/// assert!(matches!(repair::release_stuck(&store, "pay", "order-7", later).await?, repair::Release::Released { .. }));
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The store's, when it cannot be read or written.
pub async fn release_stuck(
    store: &dyn IdempotencyStore,
    biz: &str,
    key: &str,
    now: SystemTime,
) -> Result<Release, StoreError> {
    let record = match store.get(biz, key).await? {
        None => return Ok(Release::NotFound),
        Some(record) => record,
    };
    if let Some(answer) = not_a_lapsed_claim(&record, now) {
        return Ok(answer);
    }
    if record.lease_until.is_none() && !record.is_expired(now) {
        // A claim without a lease is never taken over by a call; nothing renews it.
        release_held(store, &Lease::of(&record)).await?;
        return Ok(Release::Released { fence: record.fence });
    }
    // Keep the record's expiry: a record with steps is parked, not deleted, and must
    // keep them for its next claim.
    let ttl = record
        .expires_at
        .duration_since(now)
        .unwrap_or_default()
        .max(Duration::from_millis(1));
    let takeover = Claim::new(biz, key, now, RELEASE_LEASE, ttl);
    match store.claim(&takeover).await? {
        ClaimOutcome::Acquired(lease) => {
            release_held(store, &lease).await?;
            Ok(Release::Released { fence: record.fence })
        }
        // Renewed (or finished) between the read and the takeover.
        ClaimOutcome::Existing(record) => Ok(not_a_lapsed_claim(&record, now).unwrap_or(Release::LeaseRunning {
            until: record.lease_until.unwrap_or(now),
            fence: record.fence,
        })),
    }
}

/// Free the claim of `(biz, key)` even while its lease runs. If its holder is in fact
/// running, the next call runs the body beside it, and the holder's outcome is refused
/// (`Error::LeaseLost`): use it only for a holder known to be gone (its process and
/// host down), when waiting for the lease to lapse is not an option.
///
/// # Errors
///
/// The store's, when it cannot be read or written.
pub async fn force_release(store: &dyn IdempotencyStore, biz: &str, key: &str) -> Result<Release, StoreError> {
    match store.get(biz, key).await? {
        None => Ok(Release::NotFound),
        Some(record) if record.status != Status::Processing => Ok(Release::Finished(record.status)),
        Some(record) => {
            let lease = Lease::of(&record);
            release_held(store, &lease).await?;
            Ok(Release::Released { fence: record.fence })
        }
    }
}

/// Why `record` is not a claim to free at `now`, or `None` when it is one.
fn not_a_lapsed_claim(record: &Record, now: SystemTime) -> Option<Release> {
    if record.status != Status::Processing {
        return Some(Release::Finished(record.status));
    }
    match record.lease_until {
        Some(until) if until > now && !record.is_expired(now) => Some(Release::LeaseRunning {
            until,
            fence: record.fence,
        }),
        _ => None,
    }
}

async fn release_held(store: &dyn IdempotencyStore, lease: &Lease) -> Result<(), StoreError> {
    match store.release(lease).await? {
        FenceCheck::Held => Ok(()),
        FenceCheck::Lost => Err(StoreError::new(format!(
            "biz `{}` key `{}` changed while it was being released; read it again (`idem show`)",
            lease.biz, lease.key
        ))),
    }
}

/// What an operator found out about an effect whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// It happened, with this value (the JSON of the step's `Ok` value): the next call
    /// returns it from the step without running the effect.
    Done(String),
    /// It did not happen: the next call runs the effect.
    NotDone,
}

/// What settling came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Settle {
    /// Settled: the next call takes the record over and goes on from there.
    Settled {
        /// The fence the unsettled record was held under.
        fence: u64,
    },
    /// No record of the key.
    NotFound,
    /// The record holds no unknown outcome of that step (its steps' names, as
    /// recorded, say which it has). Nothing was changed.
    NotUnknown {
        /// The steps whose outcome is unknown in this record (none, or others).
        unknown: Vec<String>,
    },
    /// The call that found the outcome unknown is still holding the record for good
    /// (a moment's work); nothing was changed. Try again.
    StillHolding,
}

/// Settle the unknown outcome of step `step` of `(biz, key)`: what `idem settle` does.
///
/// The record is the one a step that failed closed left, held so that no call takes it
/// over ([`crate::Error::OutcomeUnknown`] to every duplicate). Its step's entry becomes
/// `settlement`'s value (or is taken away, for [`Settlement::NotDone`]) and the record
/// is freed, fenced like every write, so that the next call takes it over: the settled
/// step returns its value without running, or runs.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{repair, Error, Idempotent, IdempotencyStore, MemoryStore, Step};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(MemoryStore::new());
/// let pay = Idempotent::new("pay").store(store.clone());
/// # #[derive(Debug)] enum PayError { Timeout, Idem(Error) }
/// # impl From<Error> for PayError { fn from(e: Error) -> Self { PayError::Idem(e) } }
/// let charge = |answer: Result<u32, PayError>| async {
///     // The bank timed out: nobody knows whether it charged.
///     Step::new("charge").fail_closed().run(async { answer }).await
/// };
/// let unknown = |outcome| matches!(outcome, Err(PayError::Idem(Error::OutcomeUnknown { .. })));
/// assert!(unknown(pay.execute("order-7", charge(Err(PayError::Timeout))).await));
/// // Every duplicate gets the same error; the bank is not asked again.
/// assert!(unknown(pay.execute("order-7", charge(Ok(1))).await));
/// // The bank says it charged 199: the next call gets that, and does not charge.
/// let settled = repair::settle(&*store, "pay", "order-7", "charge", repair::Settlement::Done("199".into())).await?;
/// assert!(matches!(settled, repair::Settle::Settled { .. }));
/// assert_eq!(pay.execute("order-7", charge(Ok(1))).await.unwrap(), 199);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The store's, when it cannot be read or written, or when the record changed while it
/// was being settled; an error naming the value when it is not JSON.
pub async fn settle(
    store: &dyn IdempotencyStore,
    biz: &str,
    key: &str,
    step: &str,
    settlement: Settlement,
) -> Result<Settle, StoreError> {
    let Some(record) = store.get(biz, key).await? else {
        return Ok(Settle::NotFound);
    };
    let mut steps = match record.status {
        Status::Processing => record.steps_map().map_err(|e| {
            StoreError::new(format!(
                "the steps of biz `{biz}` key `{key}` are not a JSON object: {e}"
            ))
        })?,
        _ => Default::default(),
    };
    let unknown: Vec<String> = steps
        .iter()
        .filter(|(_, entry)| matches!(Entry::read(entry), Entry::Unknown(_)))
        .map(|(name, _)| name.clone())
        .collect();
    if !unknown.iter().any(|name| name == step) {
        return Ok(Settle::NotUnknown { unknown });
    }
    // Held for good, or lapsed (its holder died before holding it): settle. A lease that
    // runs as leases do is the failing call's, about to hold it for good.
    let now = SystemTime::now();
    if record
        .lease_until
        .is_some_and(|until| until > now && until < now + UNSETTLED_LEASE / 2)
    {
        return Ok(Settle::StillHolding);
    }
    match settlement {
        Settlement::Done(json) => {
            serde_json::from_str::<serde_json::Value>(&json).map_err(|e| {
                StoreError::new(format!(
                    "the settled value of step `{step}` is not JSON ({e}): give the step's value as JSON, e.g. '{{\"id\":\"ch_1\"}}' or '199'"
                ))
            })?;
            steps.insert(step.to_owned(), json);
        }
        Settlement::NotDone => {
            steps.remove(step);
        }
    }
    let lease = Lease::of(&record);
    let json = serde_json::to_string(&steps).expect("a map of strings");
    match store.record_steps(&lease, &json).await? {
        FenceCheck::Held => {}
        FenceCheck::Lost => return Err(changed(biz, key)),
    }
    // The record keeps its steps: the release lets its lease lapse at once.
    release_held(store, &lease).await?;
    Ok(Settle::Settled { fence: record.fence })
}

fn changed(biz: &str, key: &str) -> StoreError {
    StoreError::new(format!(
        "biz `{biz}` key `{key}` changed while it was being settled; read it again (`idem show`)"
    ))
}
