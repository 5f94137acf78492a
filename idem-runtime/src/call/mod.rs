//! One execution of an operation: admission (claim, or wait, or answer from the
//! record), the body under its lease, and the recording of its outcome.

mod admission;
mod flight;
mod gate;
mod lease;
mod outcome;
pub(crate) mod transaction;

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use tokio::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

use crate::context::{inside, Context};
use crate::error::{Error, StoreError};
use crate::key::key_problem;
use crate::observe::{self, Outcome};
use crate::operation::Idempotent;
use crate::step::StepLog;
use crate::store::OwnedStore;

use admission::{Admitted, Claimed};
pub(crate) use flight::open_flights;

impl Idempotent {
    /// Run `body` at most once for `key` on this operation's store (or the installed
    /// one): claim, execute, record — or replay, reject, wait, as the crate docs say.
    pub fn execute<'a, K, T, E, F>(
        &'a self,
        key: K,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + use<'a, K, T, E, F>
    where
        K: Display,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let store = CallStore::found(self);
        call(self, store, key.to_string(), body, |_: &E| failure_of_type::<E>())
    }

    /// [`execute`](Self::execute) on the given `store`: any `Clone` store (the SQL
    /// stores, `MemoryStore`, `CachedStore`, `Arc<dyn IdempotencyStore>`), so that a
    /// finished body's outcome can still be recorded if this call is dropped.
    pub fn execute_on<'a, S, K, T, E, F>(
        &'a self,
        store: &'a S,
        key: K,
        body: F,
    ) -> impl Future<Output = Result<T, E>> + use<'a, S, K, T, E, F>
    where
        S: OwnedStore,
        K: Display,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        call(self, CallStore::Given(store), key.to_string(), body, |_: &E| {
            failure_of_type::<E>()
        })
    }
}

/// The store a call runs on: the one it was given, or the operation's own or the
/// installed one (or why there is none, boxed: the call's future carries this until it
/// runs, and an error kept inline would make every call's future larger to move).
pub(crate) enum CallStore<'a> {
    Given(&'a dyn OwnedStore),
    Found(Result<std::sync::Arc<dyn crate::store::IdempotencyStore>, Box<Error>>),
}

impl CallStore<'_> {
    /// The operation's own store or the installed one.
    pub(crate) fn found(op: &Idempotent) -> Self {
        CallStore::Found(op.store_or_installed().map_err(Box::new))
    }
}

/// The call itself, with the way a failure is described in a `FAIL` record, in its span.
///
/// The returned future holds the body at most twice (as handed in, and pinned where it
/// runs): every layer between the public entry points and the body's own poll is a
/// plain function or takes the body pinned, so a body of a few kilobytes (an HTTP
/// handler, a transaction) is not copied layer by layer (`tests/call_future.rs`).
pub(crate) fn call<'a, T, E, F>(
    op: &'a Idempotent,
    store: CallStore<'a>,
    key: String,
    body: F,
    describe: Describe<E>,
) -> impl Future<Output = Result<T, E>> + use<'a, T, E, F>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let span = observe::call_span(&op.biz, &key);
    run(op, store, key, body, describe).instrument(span)
}

async fn run<T, E, F>(
    op: &Idempotent,
    store: CallStore<'_>,
    key: String,
    body: F,
    describe: Describe<E>,
) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let found;
    let store: &dyn OwnedStore = match store {
        CallStore::Given(store) => store,
        CallStore::Found(Ok(store)) => {
            found = store;
            &found
        }
        CallStore::Found(Err(error)) => return Err((*error).into()),
    };
    let body = std::pin::pin!(body);
    Call { op, store, key }.run(body, describe).await
}

/// The `FAIL` message of an error known only by its type.
pub(crate) fn failure_of_type<E>() -> String {
    format!("the call returned an error of type `{}`", std::any::type_name::<E>())
}

/// How the outcome of a body that returned `Err` is described in a `FAIL` record.
pub(crate) type Describe<E> = fn(&E) -> String;

/// The options, the store and the key of one execution.
pub(crate) struct Call<'a> {
    pub(crate) op: &'a Idempotent,
    pub(crate) store: &'a dyn OwnedStore,
    pub(crate) key: String,
}

impl Call<'_> {
    /// Claim → execute → record, or answer from the record that stands in the way.
    async fn run<T, E, F>(self, body: Pin<&mut F>, describe: Describe<E>) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let biz = &self.op.biz;
        let refused = |error: Error| {
            observe::finished(biz, Outcome::refused(&error), None);
            Err(error.into())
        };
        let fingerprint = match self.check_input() {
            Ok(fingerprint) => fingerprint,
            Err(error) => return refused(error),
        };
        // One reading of the clock starts admission and, unless it waits, dates the claim.
        let reading = crate::clock::Reading::take();
        let admitting = reading.read();
        let Claimed { lease, read, granted } = match self.admit(fingerprint, reading).await {
            Ok(Admitted::Claimed(claimed)) => claimed,
            Ok(Admitted::Replayed(value)) => {
                observe::claim_time(biz, admitting.elapsed());
                observe::finished(biz, Outcome::Replayed, None);
                return Ok(value);
            }
            Err(error) => {
                observe::claim_time(biz, admitting.elapsed());
                return refused(error);
            }
        };
        let steps = StepLog::new(
            self.store.to_owned_store(),
            self.op.lease,
            self.op.outcome_policy_required,
        );
        let context = Context::new(lease, Some(steps));
        // The body starts as the key is granted: one reading of the clock for both.
        let running = granted;
        let outcome = self
            .hold(context.lease(), context.signal(), context.clone().scope(body))
            .await;
        let unknown = match context.step_log() {
            Some(steps) => steps.unknown().await,
            None => None,
        };
        if let Some(intent) = unknown {
            // An effect's outcome is unknown: whatever the body made of it, the record
            // stays unsettled, held so that no call takes it over.
            let error = self.leave_unsettled(context.lease(), &intent).await;
            observe::finished(biz, Outcome::Unknown, Some(running.elapsed()));
            return Err(error.into());
        }
        let ended = Instant::now();
        let (ran, kind) = (
            ended - running,
            if outcome.is_ok() {
                Outcome::Executed
            } else {
                Outcome::Failed
            },
        );
        let answer = self
            .record(context.into_lease(), outcome, describe, (read, ended))
            .await;
        observe::finished(biz, kind, Some(ran));
        answer
    }

    fn check_input(&self) -> Result<Option<&str>, Error> {
        check_input(self.op, &self.key)
    }

    fn store_error(&self, operation: &'static str, source: StoreError) -> Error {
        store_error(self.op, &self.key, operation, source)
    }

    fn error(&self, make: impl FnOnce(String, String) -> Error) -> Error {
        error_of(self.op, &self.key, make)
    }
}

/// Before anything touches the store: the options, the biz, the key, the payload
/// fingerprint, and a call for the key whose body is running here. Gives the payload's
/// fingerprint, if there is one.
pub(crate) fn check_input<'o>(op: &'o Idempotent, key: &str) -> Result<Option<&'o str>, Error> {
    if let Some((option, reason)) = &op.invalid {
        return Err(Error::InvalidOption {
            biz: op.biz.to_string(),
            option,
            reason: reason.clone(),
        });
    }
    if let Some(reason) = &op.biz_problem {
        return Err(Error::InvalidBiz {
            biz: op.biz.to_string(),
            reason: reason.clone(),
        });
    }
    if let Some(reason) = key_problem(key) {
        return Err(error_of(op, key, |biz, key| Error::InvalidKey { biz, key, reason }));
    }
    if inside(&op.biz, key) {
        return Err(error_of(op, key, |biz, key| Error::Reentrant { biz, key }));
    }
    match &op.payload {
        None => Ok(None),
        Some(Ok(payload)) => Ok(Some(&payload.fingerprint)),
        Some(Err(source)) => Err(error_of(op, key, |biz, key| Error::Encode {
            biz,
            key,
            what: "payload",
            source: source.clone(),
        })),
    }
}

/// The store failed at `operation` for `key`.
pub(crate) fn store_error(op: &Idempotent, key: &str, operation: &'static str, source: StoreError) -> Error {
    observe::store_failed(&op.biz, operation);
    if source.is_unreadable() {
        return error_of(op, key, |biz, key| Error::Decode {
            biz,
            key,
            source: Box::new(source),
        });
    }
    error_of(op, key, |biz, key| Error::Store {
        biz,
        key,
        operation,
        source,
    })
}

/// The error `make` builds from the operation's biz and the key.
pub(crate) fn error_of(op: &Idempotent, key: &str, make: impl FnOnce(String, String) -> Error) -> Error {
    make(op.biz.to_string(), key.to_owned())
}
