//! An operator's repairs: freeing a claim whose holder is gone.
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
