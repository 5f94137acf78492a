//! The body under its lease: a fresh lease before it starts, a heartbeat while it
//! runs, and the signal to the body when the lease is lost.

use std::future::Future;
use std::time::Duration;

use super::Call;
use crate::claim::{FenceCheck, Lease};
use crate::clock;
use crate::context::LeaseSignal;
use crate::error::Error;
use crate::step::unknown_error;
use crate::unknown::{Intent, UNSETTLED_LEASE};

/// After a failed renewal, the next try comes after this share of the beat: the lease
/// still has two beats to run, so a store blip costs several tries, not the lease.
const RETRY_SHARE_OF_BEAT: u32 = 4;

impl Call<'_> {
    /// Whether the granted `lease`, whose claim took `claim_took`, has at least two
    /// thirds of its length ahead. A claim
    /// that waited (for a pool connection, a row lock) was granted a lease counted from
    /// before it waited; past a third of it, the lease is renewed first, so the body
    /// never starts on a lease another caller may take over within moments. `false`
    /// when that renewal finds the key already taken over.
    pub(super) async fn lease_ahead(&self, lease: &Lease, claim_took: Duration) -> Result<bool, Error> {
        if claim_took <= self.op.lease / 3 {
            return Ok(true);
        }
        match self.store.renew(lease, clock::now(), self.op.stored_lease()).await {
            Ok(FenceCheck::Held) => Ok(true),
            Ok(FenceCheck::Lost) => Ok(false),
            Err(source) => Err(self.store_error("renew", source)),
        }
    }

    /// Hold `lease` for good: the record waits, unsettled, for an operator (the step
    /// that found `intent`'s outcome unknown has recorded it). If the write fails, the
    /// lease lapses as usual, and the call that takes the record over finds the unknown
    /// outcome among the steps and fails closed again. The call's error.
    pub(super) async fn leave_unsettled(&self, lease: &Lease, intent: &Intent) -> Error {
        match self.store.renew(lease, clock::now(), UNSETTLED_LEASE).await {
            Ok(FenceCheck::Held) => {}
            // Taken over already (this holder stalled past its lease): the successor
            // finds the unknown outcome among the steps, and fails closed too.
            Ok(FenceCheck::Lost) => {
                tracing::warn!(target: "idem", biz = %lease.biz, key = %crate::observe::shown_key(&lease.key),
                "the unsettled record was taken over before it could be held")
            }
            Err(source) => {
                tracing::warn!(target: "idem", biz = %lease.biz, key = %crate::observe::shown_key(&lease.key), error = %source,
                "could not hold the unsettled record; the next call fails closed again once its lease lapses")
            }
        }
        unknown_error(lease, intent)
    }

    /// Run `body` while renewing `lease` every third of its length.
    ///
    /// The renewals run inside the same future as the body, not in a spawned task: when
    /// the caller drops the call mid-body (cancellation, timeout, panic), the heartbeat
    /// goes with it and the lease lapses on its own, so a retry can take over. A renewal
    /// that finds the key taken over tells the body through `signal`.
    pub(super) async fn hold<F: Future>(&self, lease: &Lease, signal: &LeaseSignal, body: F) -> F::Output {
        let (lease_for, stored_lease) = (self.op.lease, self.op.stored_lease());
        let renewals = async {
            let beat = (lease_for / 3).max(Duration::from_millis(1));
            let mut next = beat;
            loop {
                tokio::time::sleep(next).await;
                match self.store.renew(lease, clock::now(), stored_lease).await {
                    Ok(FenceCheck::Held) => next = beat,
                    Ok(FenceCheck::Lost) => {
                        tracing::warn!(target: "idem", biz = %lease.biz, key = %crate::observe::shown_key(&lease.key), fence = lease.fence,
                            "idempotency lease lost while the body runs: another call took the key over"
                        );
                        signal.lose();
                        // Nothing left to renew; the body's final write will be fenced.
                        std::future::pending::<()>().await;
                    }
                    Err(error) => {
                        tracing::warn!(target: "idem", biz = %lease.biz, key = %crate::observe::shown_key(&lease.key), fence = lease.fence, %error,
                            "could not renew the idempotency lease; retrying soon"
                        );
                        next = (beat / RETRY_SHARE_OF_BEAT).max(Duration::from_millis(1));
                    }
                }
            }
        };
        tokio::pin!(body);
        tokio::select! {
            biased;
            output = &mut body => output,
            () = renewals => unreachable!("the heartbeat loop never ends"),
        }
    }
}
