//! The task-local context of a running idempotent call.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

use crate::claim::Lease;
use crate::step::StepLog;

tokio::task_local! {
    static CURRENT: Context;
}

/// Which claim the current body runs under.
///
/// Side effects (an SMS, points, a message to a queue) reuse it so that they are
/// idempotent on the same key: pass [`Context::effect_key`] to the downstream service.
///
/// Cloning it is cheap: a clone is another handle on the same running call.
#[derive(Debug, Clone)]
pub struct Context {
    running: Arc<Running>,
}

/// The claim a body runs under, shared by its context, its heartbeat and its steps.
#[derive(Debug)]
struct Running {
    lease: Lease,
    /// `created_at` of the record's life, in microseconds since the epoch.
    life: u64,
    signal: LeaseSignal,
    /// Where [`step`](crate::step) records; none in a transactional call.
    steps: Option<StepLog>,
}

/// Set by the heartbeat when a renewal finds the claim taken over.
#[derive(Debug, Default)]
pub(crate) struct LeaseSignal {
    lost: AtomicBool,
    notify: Notify,
}

impl LeaseSignal {
    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Context {
    /// The context of a body running under `lease`, recording its steps in `steps`.
    pub(crate) fn new(lease: Lease, steps: Option<StepLog>) -> Self {
        let life = lease
            .created_at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        Self {
            running: Arc::new(Running {
                life: u64::try_from(life).unwrap_or(u64::MAX),
                lease,
                signal: LeaseSignal::default(),
                steps,
            }),
        }
    }

    /// The lease the body runs under.
    pub(crate) fn lease(&self) -> &Lease {
        &self.running.lease
    }

    /// What the heartbeat sets when the lease is lost.
    pub(crate) fn signal(&self) -> &LeaseSignal {
        &self.running.signal
    }

    /// The lease, once the body is done with its context (a clone, if something kept
    /// one of its handles).
    pub(crate) fn into_lease(self) -> Lease {
        match Arc::try_unwrap(self.running) {
            Ok(running) => running.lease,
            Err(running) => running.lease.clone(),
        }
    }

    /// Business namespace of the call.
    pub fn biz(&self) -> &str {
        &self.running.lease.biz
    }

    /// Idempotency key of the call.
    pub fn key(&self) -> &str {
        &self.running.lease.key
    }

    /// Fence number of the claim this body runs under: it grows with every claim of
    /// the key, takeovers included, so a downstream service that remembers the highest
    /// fence it saw can refuse a write from a holder that was taken over.
    pub fn fence(&self) -> u64 {
        self.running.lease.fence
    }

    /// When this life of the record began. A record that expired (or was purged) and is
    /// claimed again starts a new life; a takeover continues the old one.
    pub fn life_started(&self) -> SystemTime {
        UNIX_EPOCH + std::time::Duration::from_micros(self.running.life)
    }

    /// A key for one side effect of this call, `"{biz}:{key}:{life}:{effect}"`: the same
    /// on every retry and takeover within one life of the record, so a downstream
    /// service deduplicates it; different in the key's next life (after its TTL), so a
    /// legitimate new request's effect is not swallowed.
    pub fn effect_key(&self, effect: &str) -> String {
        format!("{}:{}:{}:{effect}", self.biz(), self.key(), self.running.life)
    }

    /// A key for this life of the record as a whole, `"{biz}:{key}:{life}"`: what a
    /// body that is one call to another service hands it (and what the lookup of
    /// `on_takeover = reconcile(..)` is asked about). Like [`effect_key`](Self::effect_key),
    /// the same on every retry and takeover within one life.
    pub fn life_key(&self) -> String {
        format!("{}:{}:{}", self.biz(), self.key(), self.running.life)
    }

    /// Whether this call still holds its claim, as far as the heartbeat knows: false once
    /// a renewal found the key taken over by another caller (after this call's lease
    /// lapsed). The body's outcome will then be refused ([`Error::LeaseLost`]); a body
    /// with outside effects should check before each one.
    ///
    /// [`Error::LeaseLost`]: crate::Error::LeaseLost
    pub fn lease_held(&self) -> bool {
        !self.running.signal.is_lost()
    }

    /// Resolves when the heartbeat finds this call's claim taken over; never, while it
    /// holds. Select on it to stop a long body that no longer owns its key:
    ///
    /// ```ignore
    /// let ctx = idem::context().expect("inside an idempotent call");
    /// tokio::select! {
    ///     done = long_work() => done,
    ///     () = ctx.lease_lost() => Err(MyError::Abandoned),
    /// }
    /// ```
    pub async fn lease_lost(&self) {
        loop {
            let notified = self.running.signal.notify.notified();
            if self.running.signal.is_lost() {
                return;
            }
            notified.await;
        }
    }

    /// The call's step log, where it has one.
    pub(crate) fn step_log(&self) -> Option<&StepLog> {
        self.running.steps.as_ref()
    }

    /// `body` run with this context as the task's current one. A plain function, not an
    /// `async fn`: the body is held once, in the returned future, not copied into one.
    pub(crate) fn scope<F: Future>(self, body: F) -> tokio::task::futures::TaskLocalFuture<Context, F> {
        CURRENT.scope(self, body)
    }
}

/// The context of the idempotent call whose body is running on this task, or `None`
/// outside one. Tasks spawned from the body do not inherit it: pass it along.
pub fn context() -> Option<Context> {
    CURRENT.try_with(Context::clone).ok()
}

/// Whether the body running on this task holds `(biz, key)`: a call for the same key
/// from inside it would wait on itself.
pub(crate) fn inside(biz: &str, key: &str) -> bool {
    CURRENT
        .try_with(|current| current.biz() == biz && current.key() == key)
        .unwrap_or(false)
}
