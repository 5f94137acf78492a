//! Transactional mode: the claim and the record written in a transaction the caller
//! owns, so that they commit — or roll back — with the business's own writes.
//!
//! Nothing here is visible to another caller before the commit, so there is no lease,
//! no heartbeat and no takeover: a duplicate meets the uncommitted record's row lock in
//! the database and waits there (bounded by `wait`), then finds the committed outcome —
//! or nothing, if the first transaction rolled back, and claims. The database binding
//! ([`TransactionStore`]) lives with the SQL stores; this is the part every database
//! shares: admission, and the outcome as a verdict.

use std::future::Future;
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::admission::answer_finished;
use super::outcome::{judge, Verdict};
use super::{check_input, error_of, store_error, Describe};
use crate::claim::{fingerprints_agree, Claim, ClaimOutcome, FenceCheck, Lease};
use crate::clock;
use crate::context::Context;
use crate::error::{Error, StoreError};
use crate::observe::{self, Outcome};
use crate::operation::Idempotent;
use crate::policy::OnError;
use crate::record::Status;

/// A store bound to one open transaction of the caller: every write goes into it.
///
/// Implemented by the SQL stores' binding to `sqlx::Transaction`; what only an
/// integration needs. The claim follows the rules of [`IdempotencyStore::claim`]
/// (atomic, [`Claim::admits`], [`Claim::granted`]), and the holder writes follow
/// [`Lease::holds`], as in the store trait.
///
/// [`IdempotencyStore::claim`]: crate::IdempotencyStore::claim
pub trait TransactionStore: Send {
    /// Claim `(biz, key)` in the transaction. A record another open transaction holds
    /// is waited for, at most `wait` — or, when `wait` is `None`, as long as the
    /// database lets any statement of the connection wait for a lock; `Ok(None)` when
    /// it is still held then. A claim bounded by `wait` that fails leaves the
    /// transaction as it was (a savepoint where the database would otherwise abort it).
    fn claim(
        &mut self,
        claim: &Claim<'_>,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Option<ClaimOutcome>, StoreError>> + Send;

    /// Record `Succeeded` with `response`, as [`IdempotencyStore::complete`](crate::IdempotencyStore::complete).
    fn complete(
        &mut self,
        lease: &Lease,
        response: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// Record `Failed` with `message`, as [`IdempotencyStore::fail`](crate::IdempotencyStore::fail).
    fn fail(
        &mut self,
        lease: &Lease,
        message: &str,
        now: SystemTime,
        ttl: Duration,
    ) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;

    /// Free the key, as [`IdempotencyStore::release`](crate::IdempotencyStore::release).
    fn release(&mut self, lease: &Lease) -> impl Future<Output = Result<FenceCheck, StoreError>> + Send;
}

/// What admission in a transaction came to.
#[derive(Debug)]
pub enum Admission<'a, T> {
    /// The key is claimed in the transaction: run the body, then [`TransactionClaim::record`].
    Claimed(TransactionClaim<'a>),
    /// A committed call's value, replayed.
    Replayed(T),
}

/// A key claimed in the caller's transaction.
#[derive(Debug)]
pub struct TransactionClaim<'a> {
    op: &'a Idempotent,
    key: String,
    lease: Lease,
}

impl Idempotent {
    /// Admission of `key` in the transaction `store` is bound to: the claim, or the
    /// answer of the committed record that stands in the way, or an error
    /// ([`Error::InProgress`] when another transaction held the key past `wait`). The
    /// first half of a transactional call; the SQL stores' `execute_in` and the
    /// attribute's `tx = ...` are built on it.
    pub async fn admit_in<X, T>(&self, store: &mut X, key: String) -> Result<Admission<'_, T>, Error>
    where
        X: TransactionStore,
        T: DeserializeOwned,
    {
        let admitting = std::time::Instant::now();
        let admitted = self.claim_in_transaction(store, key).await;
        let biz = &self.biz;
        match &admitted {
            Ok(Admission::Claimed(claim)) => observe::claimed(biz, claim.lease.fence, false, admitting.elapsed()),
            Ok(Admission::Replayed(_)) => {
                observe::claim_time(biz, admitting.elapsed());
                observe::finished(biz, Outcome::Replayed, None);
            }
            Err(error) => {
                observe::claim_time(biz, admitting.elapsed());
                observe::finished(biz, Outcome::refused(error), None);
            }
        }
        admitted
    }

    async fn claim_in_transaction<X, T>(&self, store: &mut X, key: String) -> Result<Admission<'_, T>, Error>
    where
        X: TransactionStore,
        T: DeserializeOwned,
    {
        let fingerprint = check_input(self, &key)?;
        if self.on_error == OnError::Record {
            return Err(Error::InvalidOption {
                biz: self.biz.to_string(),
                option: "on_error",
                reason: "`OnError::Record` cannot be used in transactional mode: the FAIL record would commit only \
                         if the caller commits the transaction, together with whatever the body wrote before its \
                         `Err`. Use `OnError::Release` (the default: the claim rolls back with the transaction), and \
                         keep a failure you must remember in a table of your own"
                    .to_owned(),
            });
        }
        let request = self.request_body();
        let claim = Claim::new(&self.biz, &key, clock::now(), self.stored_lease(), self.ttl)
            .with_fingerprint(fingerprint)
            .with_request_body(request.as_deref());
        let outcome = store
            .claim(&claim, self.wait)
            .await
            .map_err(|source| store_error(self, &key, "claim", source))?;
        let record = match outcome {
            Some(ClaimOutcome::Acquired(lease)) => {
                let lease = lease.with_retention(self.retention());
                return Ok(Admission::Claimed(TransactionClaim { op: self, key, lease }));
            }
            Some(ClaimOutcome::Existing(record)) => record,
            None => return Err(error_of(self, &key, |biz, key| Error::InProgress { biz, key })),
        };
        if !fingerprints_agree(record.fingerprint.as_deref(), fingerprint) {
            return Err(error_of(self, &key, |biz, key| Error::PayloadMismatch { biz, key }));
        }
        if record.status == Status::Processing {
            // Committed while running by a call in the leased mode (or a transactional
            // call whose caller committed without letting it finish): its lease rules.
            return Err(error_of(self, &key, |biz, key| Error::InProgress { biz, key }));
        }
        answer_finished(self, &key, record).map(Admission::Replayed)
    }
}

impl TransactionClaim<'_> {
    /// Run the body inside the call's context ([`context()`](crate::context) names the
    /// claim; [`step`](crate::step) refuses, since the transaction is the record).
    pub fn run<F: Future>(&self, body: F) -> impl Future<Output = F::Output> {
        Context::new(self.lease.clone(), None).scope(body)
    }

    /// Write the body's outcome into the transaction: `SUCCESS` with the value, or per
    /// `on_error` a `FAIL` or a release, before the caller gets its answer. When the
    /// write fails, the caller gets [`Error::Store`] (the transaction is to be rolled
    /// back), and the body's own error, if it had one, is logged.
    pub async fn record<X, T, E>(self, store: &mut X, outcome: Result<T, E>, describe: Describe<E>) -> Result<T, E>
    where
        X: TransactionStore,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        let kind = if outcome.is_ok() {
            Outcome::Executed
        } else {
            Outcome::Failed
        };
        observe::finished(&self.op.biz, kind, None);
        let (verdict, answer) = judge(self.op, &self.key, outcome, describe);
        let (now, ttl, lease) = (clock::now(), self.op.ttl, &self.lease);
        let written = match &verdict {
            Verdict::Succeeded(json) => store.complete(lease, json, now, ttl).await,
            Verdict::Failed(message) => store.fail(lease, message, now, ttl).await,
            Verdict::Released => store.release(lease).await,
        };
        let operation = verdict.operation();
        let failed = |error: Error| {
            if answer.is_err() {
                tracing::warn!(target: "idem", %error, "the outcome of a failed transactional call was not recorded");
            }
            Err(error.into())
        };
        match written {
            Ok(FenceCheck::Held) => answer,
            Ok(FenceCheck::Lost) => failed(error_of(self.op, &self.key, |biz, key| Error::LeaseLost {
                biz,
                key,
                fence: lease.fence,
                operation,
            })),
            Err(source) => failed(store_error(self.op, &self.key, operation, source)),
        }
    }
}
