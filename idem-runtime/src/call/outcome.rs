//! Recording the outcome of a finished body.
//!
//! Once the body has finished, its outcome must reach the store whatever happens to the
//! caller: a record left `PROCESSING` lets a retry run the body again once the lease
//! lapses. So the write is retried (renewing the lease between tries) for as long as
//! the caller waits — half a lease — and then, or as soon as the caller's future is
//! dropped, it goes on in a task of its own. A refused write is checked against the
//! record: a write whose reply was lost may have committed, and then the outcome
//! recorded is this call's own; a refusal the record contradicts (still `PROCESSING`
//! under this call's lease) is written again, a few times.
//!
//! The retries are at most a twentieth of a lease apart, so a store that comes back
//! before the lease lapses gets the outcome before a retry can take the key over. One
//! that stays out of reach until the lease lapses cannot tell this finished holder from
//! a dead one: a retry that reaches it first runs the body again, and this write is
//! refused by the fence (the window of leased mode that transactional mode closes).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

// tokio's clock: under a paused test clock the retries' pauses and their bound move
// together (on the monotonic clock a failing store was retried for the bound's real
// length, every pause skipped).
use tokio::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{error_of, Call, Describe};
use crate::claim::{FenceCheck, Lease};
use crate::clock;
use crate::error::{Error, StoreError};
use crate::operation::Idempotent;
use crate::policy::OnError;
use crate::record::{Record, Status};
use crate::replay::encode;
use crate::store::{IdempotencyStore, OwnedStore};

/// Retrying the write of an outcome: first and longest pause. The pause is also never
/// longer than a twentieth of the lease: a write held up by an outage must reach the
/// store soon after it is back, before the lease lapses and a retry may take over.
const FIRST_RETRY: Duration = Duration::from_millis(50);
const LONGEST_RETRY: Duration = Duration::from_secs(1);
const RETRIES_PER_LEASE: u32 = 20;

/// How many more times an outcome is written when the store refused it while its own
/// record still shows it held under the call's lease (see `after_refusal`).
const CONTRADICTED_REFUSALS: u32 = 2;

/// How many leases a write handed to its own task keeps trying for (10 minutes for the
/// default 30 s lease). Past that, a response the store keeps refusing is recorded as a
/// failure instead, so the body is not run again; only if that fails too is the lease
/// let go.
const DETACHED_LEASES: u32 = 20;

/// The longest `error_message` written: every store's column holds it (MySQL's `TEXT`
/// holds 64 KiB), and a failure is described, not dumped.
const MAX_ERROR_MESSAGE: usize = 4096;

/// `message`, cut at a character boundary to at most [`MAX_ERROR_MESSAGE`] bytes.
fn bounded(mut message: String) -> String {
    if message.len() > MAX_ERROR_MESSAGE {
        let mut end = MAX_ERROR_MESSAGE - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// The outcome of a finished body, as the store records it.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// `SUCCESS` with the response's JSON.
    Succeeded(String),
    /// `FAIL` with a message.
    Failed(String),
    /// The record deleted, so that a retry runs the body again.
    Released,
}

impl Verdict {
    pub(crate) fn operation(&self) -> &'static str {
        match self {
            Verdict::Succeeded(_) => "complete",
            Verdict::Failed(_) => "fail",
            Verdict::Released => "release",
        }
    }

    /// Whether `record` (read after a refused write) shows this verdict written under
    /// `lease`: same life, same fence, finished as this verdict says.
    fn recorded_in(&self, record: Option<&Record>, lease: &Lease) -> bool {
        let ours = |status| {
            record.is_some_and(|r| r.status == status && r.fence == lease.fence && r.created_at == lease.created_at)
        };
        match self {
            Verdict::Succeeded(_) => ours(Status::Succeeded),
            Verdict::Failed(_) => ours(Status::Failed),
            // Gone, or a later life: the delete went through.
            Verdict::Released => record.is_none_or(|r| r.created_at != lease.created_at),
        }
    }
}

/// How a write of an outcome ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The verdict is in the record.
    Recorded,
    /// The key was taken over; the write changed nothing.
    Lost,
}

/// The write of one outcome, owning all it needs to finish without its caller.
#[derive(Debug)]
struct OutcomeWrite {
    lease: Lease,
    verdict: Verdict,
    /// The lease as the holder counts it.
    lease_for: Duration,
    /// The lease as the store is asked to keep it (with the clock tolerance).
    stored_lease: Duration,
    ttl: Duration,
    renewed_at: Instant,
    /// The clock's reading at the claim: the instants written are counted from it.
    read: clock::Reading,
}

impl OutcomeWrite {
    /// Write until the store answers or `give_up` passes, renewing the lease between
    /// tries so it cannot lapse while the store is failing the write alone.
    async fn settle(&mut self, store: &dyn IdempotencyStore, give_up: Instant) -> Result<Settled, StoreError> {
        match self.write(store).await {
            Ok(FenceCheck::Held) => Ok(Settled::Recorded),
            // Refused, or failed (rare): in a future of its own, so that a call's future
            // does not carry the retries' state.
            written => Box::pin(self.settle_after(written, store, give_up)).await,
        }
    }

    /// Go on from a first write that was refused or failed.
    async fn settle_after(
        &mut self,
        written: Result<FenceCheck, StoreError>,
        store: &dyn IdempotencyStore,
        give_up: Instant,
    ) -> Result<Settled, StoreError> {
        let longest = LONGEST_RETRY
            .min(self.lease_for / RETRIES_PER_LEASE)
            .max(Duration::from_millis(1));
        let mut pause = FIRST_RETRY.min(longest);
        let mut written = Some(written);
        loop {
            let result = match written.take() {
                Some(first) => first,
                None => self.write(store).await,
            };
            match result {
                Ok(FenceCheck::Held) => return Ok(Settled::Recorded),
                Ok(FenceCheck::Lost) => return Ok(self.after_refusal(store).await),
                Err(error) if Instant::now() + pause < give_up => {
                    tracing::warn!(target: "idem", %error, biz = %self.lease.biz, key = %crate::observe::shown_key(&self.lease.key), fence = self.lease.fence,
                        operation = self.verdict.operation(), "could not record a finished call; retrying"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(longest);
                    if self.renewed_at.elapsed() >= self.lease_for / 3 {
                        match store.renew(&self.lease, clock::now(), self.stored_lease).await {
                            Ok(FenceCheck::Held) => self.renewed_at = Instant::now(),
                            Ok(FenceCheck::Lost) => return Ok(self.after_refusal(store).await),
                            Err(_) => {}
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn write(&self, store: &dyn IdempotencyStore) -> Result<FenceCheck, StoreError> {
        let lease = &self.lease;
        let written = match &self.verdict {
            Verdict::Succeeded(json) => store.complete(lease, json, self.read.later(), self.ttl).await,
            Verdict::Failed(message) => store.fail(lease, message, self.read.later(), self.ttl).await,
            Verdict::Released => store.release(lease).await,
        };
        if matches!(written, Ok(FenceCheck::Held)) {
            super::flight::recorded_here(store, &lease.biz, &lease.key);
        }
        written
    }

    /// The store refused the write as if the record no longer carried this lease: an
    /// earlier try committed and its reply was lost, or the key was taken over — or the
    /// refusal is wrong, and the record, read back, is still `PROCESSING` under this
    /// very lease. A fenced write is safe to repeat (the store decides again), so that
    /// one is written again, up to [`CONTRADICTED_REFUSALS`] times: answering `Lost`
    /// would leave the finished body's record to be taken over and run again.
    async fn after_refusal(&self, store: &dyn IdempotencyStore) -> Settled {
        let lease = &self.lease;
        let pause = FIRST_RETRY.min(self.lease_for / RETRIES_PER_LEASE);
        let mut again = CONTRADICTED_REFUSALS;
        loop {
            let record = match store.get(&lease.biz, &lease.key).await {
                Ok(record) => record,
                Err(_) => return Settled::Lost,
            };
            if self.verdict.recorded_in(record.as_ref(), lease) {
                return Settled::Recorded;
            }
            if again == 0 || !record.as_ref().is_some_and(|record| lease.holds(record)) {
                return Settled::Lost;
            }
            again -= 1;
            tracing::warn!(target: "idem", biz = %lease.biz, key = %crate::observe::shown_key(&lease.key), fence = lease.fence,
                operation = self.verdict.operation(),
                "the store refused a finished call's outcome, but its record is still held under this call's lease; writing it again"
            );
            tokio::time::sleep(pause).await;
            if let Ok(FenceCheck::Held) = self.write(store).await {
                return Settled::Recorded;
            }
        }
    }
}

/// A write in progress; dropped before it settles (the caller went away, or gave up
/// waiting), it hands the write to a task of its own.
struct Recording<'a> {
    store: &'a dyn OwnedStore,
    write: Option<OutcomeWrite>,
}

impl Recording<'_> {
    async fn settle(&mut self, give_up: Instant) -> Result<Settled, StoreError> {
        let write = self.write.as_mut().expect("a recording settles once");
        let settled = write.settle(self.store, give_up).await;
        if settled.is_ok() {
            self.write = None;
        }
        settled
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        let Some(mut write) = self.write.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::error!(target: "idem", biz = %write.lease.biz, key = %crate::observe::shown_key(&write.lease.key),
                "no tokio runtime to finish recording a finished call; a retry after the lease will run it again"
            );
            return;
        };
        let store: Arc<dyn IdempotencyStore> = self.store.to_owned_store();
        runtime.spawn(async move {
            let give_up = Instant::now() + write.lease_for * DETACHED_LEASES;
            let settled = match write.settle(&*store, give_up).await {
                Err(error) if matches!(write.verdict, Verdict::Succeeded(_)) => {
                    // The store would not take the response (too large, a constraint): a
                    // duplicate learns that much rather than running the body again.
                    write.verdict = Verdict::Failed(bounded(format!(
                        "the body succeeded but its response could not be recorded: {error}"
                    )));
                    let give_up = Instant::now() + write.lease_for;
                    write.settle(&*store, give_up).await
                }
                other => other,
            };
            match settled {
                Ok(Settled::Recorded) => tracing::debug!(target: "idem", biz = %write.lease.biz, key = %crate::observe::shown_key(&write.lease.key), "recorded a finished call after its caller left"
                ),
                Ok(Settled::Lost) => tracing::warn!(target: "idem", biz = %write.lease.biz, key = %crate::observe::shown_key(&write.lease.key), fence = write.lease.fence,
                    "a finished call's outcome was refused: the key was taken over"
                ),
                Err(error) => tracing::error!(target: "idem", %error, biz = %write.lease.biz, key = %crate::observe::shown_key(&write.lease.key),
                    "gave up recording a finished call; a retry after the lease will run it again"
                ),
            }
        });
    }
}

/// What the store is to record for a body's `outcome`, and what the caller gets once it
/// is recorded. An `Ok` value that would not replay equal is recorded `FAIL` (the body
/// ran; it must not run again) and the caller gets [`Error::Encode`]; an `Err` is
/// released or recorded as `on_error` says, and handed back as it is.
pub(crate) fn judge<T, E>(
    op: &Idempotent,
    key: &str,
    outcome: Result<T, E>,
    describe: Describe<E>,
) -> (Verdict, Result<T, E>)
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    match outcome {
        Ok(value) => match encode(&value) {
            Ok(json) => (Verdict::Succeeded(op.kept.answer(json)), Ok(value)),
            Err(source) => {
                let message = bounded(format!("the response could not be recorded: {source}"));
                let error = error_of(op, key, |biz, key| Error::Encode {
                    biz,
                    key,
                    what: "response",
                    source: Arc::new(source),
                });
                (Verdict::Failed(message), Err(error.into()))
            }
        },
        Err(error) => {
            let verdict = match op.on_error {
                OnError::Release => Verdict::Released,
                OnError::Record => Verdict::Failed(bounded(describe(&error))),
            };
            (verdict, Err(error))
        }
    }
}

impl Call<'_> {
    /// Record the outcome, then hand the caller its result. An `Ok`
    /// value that would not replay equal is recorded `FAIL` (the body ran; it must not
    /// run again) and the caller gets [`Error::Encode`]. `read` is the clock's reading at
    /// the claim, `now` the moment the body ended.
    ///
    /// A plain function: the write is set up here and awaited in one future, which holds
    /// the outcome and the lease once (`async fn` layers would each keep a copy).
    pub(super) fn record<T, E>(
        &self,
        lease: Lease,
        outcome: Result<T, E>,
        describe: Describe<E>,
        (read, now): (clock::Reading, Instant),
    ) -> impl Future<Output = Result<T, E>> + use<'_, T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let fence = lease.fence;
        let (verdict, answer) = judge(self.op, &self.key, outcome, describe);
        let (succeeded, operation) = (matches!(verdict, Verdict::Succeeded(_)), verdict.operation());
        let mut recording = Recording {
            store: self.store,
            write: Some(OutcomeWrite {
                lease,
                verdict,
                lease_for: self.op.lease,
                stored_lease: self.op.stored_lease(),
                ttl: self.op.ttl,
                // Unknown when the heartbeat last renewed: renew at the first retry.
                renewed_at: now.checked_sub(self.op.lease).unwrap_or(now),
                read,
            }),
        };
        // The caller waits half a lease; the write goes on without it after that.
        let give_up = now + self.op.lease / 2;
        async move {
            let settled = recording.settle(give_up).await;
            match (settled, succeeded) {
                (Ok(Settled::Recorded), _) => answer,
                (Ok(Settled::Lost), true) => {
                    let error = self.lease_lost(fence, operation);
                    tracing::warn!(target: "idem", %error, "idempotent call finished after losing its claim");
                    Err(error.into())
                }
                (Err(source), true) => Err(self.store_error(operation, source).into()),
                // The body failed: the caller gets its own error whatever happens here;
                // what went wrong with the record is logged.
                (Ok(Settled::Lost), false) => {
                    let error = self.lease_lost(fence, operation);
                    tracing::warn!(target: "idem", %error, "idempotent call failed after losing its claim");
                    answer
                }
                (Err(source), false) => {
                    let error = self.store_error(operation, source);
                    tracing::warn!(target: "idem", %error, "could not yet record the outcome of a failed idempotent call");
                    answer
                }
            }
        }
    }

    fn lease_lost(&self, fence: u64, operation: &'static str) -> Error {
        crate::observe::lease_lost(&self.op.biz);
        self.error(|biz, key| Error::LeaseLost {
            biz,
            key,
            fence,
            operation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_bounded_at_a_character() {
        assert_eq!(bounded("short".into()), "short");
        let long = bounded("é".repeat(5000));
        assert!(long.len() <= MAX_ERROR_MESSAGE && long.ends_with('…'), "{}", long.len());
    }
}
