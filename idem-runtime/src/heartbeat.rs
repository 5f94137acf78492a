//! Keeping a lease alive while the body runs.

use std::future::Future;
use std::time::Duration;

use crate::claim::{FenceCheck, Lease};
use crate::clock;
use crate::store::IdempotencyStore;

/// Run `body` while renewing `lease` every third of `lease_for`.
///
/// The renewals run inside the same future as the body, not in a spawned task: when
/// the caller drops the call (cancellation, timeout, panic), the heartbeat goes with it
/// and the lease lapses on its own, so a retry can take over.
pub(crate) async fn hold<F: Future>(
    store: &dyn IdempotencyStore,
    lease: &Lease,
    lease_for: Duration,
    body: F,
) -> F::Output {
    let renewals = async {
        let period = (lease_for / 3).max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(period).await;
            match store.renew(lease, clock::now(), lease_for).await {
                Ok(FenceCheck::Held) => {}
                Ok(FenceCheck::Lost) => {
                    tracing::warn!(
                        biz = %lease.biz, key = %lease.key, fence = lease.fence,
                        "idempotency lease lost while the body runs: another call took the key over"
                    );
                    // Nothing left to renew; the body's final write will be fenced.
                    std::future::pending::<()>().await;
                }
                Err(error) => tracing::warn!(
                    biz = %lease.biz, key = %lease.key, fence = lease.fence, %error,
                    "could not renew the idempotency lease; retrying at the next beat"
                ),
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
