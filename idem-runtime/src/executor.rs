//! `Idempotent`: claim, execute, record.

use std::borrow::Cow;
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::{DeserializeOwned, Error as _};
use serde::Serialize;

use crate::claim::{fingerprints_agree, Claim, ClaimOutcome, FenceCheck, Lease};
use crate::context::Context;
use crate::default_store::{installed, SharedStore};
use crate::error::{Error, StoreError};
use crate::fingerprint::fingerprint;
use crate::key::{biz_problem, key_problem};
use crate::policy::{Mode, OnError};
use crate::record::{Record, Status};
use crate::store::IdempotencyStore;
use crate::{clock, heartbeat};

/// Default `ttl`: a finished record answers duplicates for a day.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default `lease`: a claim is respected for 30 s without a heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Polling of a `Processing` record while waiting: first and longest pause.
const WAIT_FIRST_POLL: Duration = Duration::from_millis(5);
const WAIT_LONGEST_POLL: Duration = Duration::from_millis(100);

/// Retrying the record of a finished body while the store is unreachable: first and
/// longest pause.
const COMPLETE_FIRST_RETRY: Duration = Duration::from_millis(50);
const COMPLETE_LONGEST_RETRY: Duration = Duration::from_secs(1);

/// The options of one idempotent operation, and the way to run it.
///
/// This is what `#[idempotent]` expands to; use it directly where an attribute does
/// not fit (a closure, a handler assembled at run time):
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use idem_runtime::{Idempotent, MemoryStore, Mode};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_runtime::Error> {
/// let refund = Idempotent::new("refund")
///     .ttl(Duration::from_secs(3600))
///     .mode(Mode::ReturnFirst)
///     .store(Arc::new(MemoryStore::new()));
/// let first: u32 = refund.execute("order-7", async { Ok::<_, idem_runtime::Error>(199) }).await?;
/// let again: u32 = refund.execute("order-7", async { Ok::<_, idem_runtime::Error>(0) }).await?;
/// assert_eq!((first, again), (199, 199)); // the second body never ran
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Idempotent {
    biz: Cow<'static, str>,
    ttl: Duration,
    mode: Mode,
    lease: Duration,
    on_error: OnError,
    wait: Option<Duration>,
    /// The payload's fingerprint, or why it could not be computed (reported at execute).
    fingerprint: Option<Result<String, String>>,
    store: Option<Arc<dyn IdempotencyStore>>,
}

impl Idempotent {
    /// An operation in the business namespace `biz`, with the defaults: `ttl` 24 h,
    /// `ReturnFirst`, `lease` 30 s, `on_error = Release`, no `wait`, no payload, the
    /// installed store.
    pub fn new(biz: impl Into<Cow<'static, str>>) -> Self {
        Self {
            biz: biz.into(),
            ttl: DEFAULT_TTL,
            mode: Mode::ReturnFirst,
            lease: DEFAULT_LEASE,
            on_error: OnError::Release,
            wait: None,
            fingerprint: None,
            store: None,
        }
    }

    /// How long a finished record answers duplicates, counted from completion.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// What a duplicate of a finished call gets.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a `Processing` claim is respected without a heartbeat.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// What happens to the claim when the body returns `Err`.
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// Let a duplicate that finds the first call still running wait up to `wait` for
    /// its outcome instead of failing at once with [`Error::InProgress`].
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Fingerprint `payload` and store it with the claim: the same key with another
    /// payload then fails with [`Error::PayloadMismatch`]. A payload that cannot be
    /// serialized fails the call with [`Error::Encode`] before anything is claimed.
    pub fn payload<P: Serialize + ?Sized>(mut self, payload: &P) -> Self {
        self.fingerprint = Some(fingerprint(payload).map_err(|e| e.to_string()));
        self
    }

    /// Use `store` instead of the installed default.
    pub fn store(mut self, store: impl SharedStore) -> Self {
        self.store = Some(store.into_shared());
        self
    }

    /// The business namespace.
    pub fn biz(&self) -> &str {
        &self.biz
    }

    /// Run `body` at most once for `key` on this operation's store (or the installed
    /// one): claim, execute, record — or replay, reject, wait, as DESIGN §3 says.
    pub async fn execute<T, E, F>(&self, key: impl Display, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let store = match self.store.clone().or_else(installed) {
            Some(store) => store,
            None => {
                return Err(Error::NoStore {
                    biz: self.biz.to_string(),
                }
                .into())
            }
        };
        self.execute_on(&*store, key, body).await
    }

    /// [`execute`](Self::execute) on the given `store`.
    pub async fn execute_on<T, E, F>(&self, store: &dyn IdempotencyStore, key: impl Display, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let call = Call {
            op: self,
            store,
            key: key.to_string(),
        };
        call.run(body).await
    }
}

/// One execution of an operation: the options, the store and the key together.
struct Call<'a> {
    op: &'a Idempotent,
    store: &'a dyn IdempotencyStore,
    key: String,
}

impl Call<'_> {
    async fn run<T, E, F>(self, body: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let fingerprint = self.check_input()?;
        let wait_until = self.op.wait.map(|wait| Instant::now() + wait);
        let mut pause = WAIT_FIRST_POLL;
        loop {
            let claim = Claim::new(&self.op.biz, &self.key, clock::now(), self.op.lease, self.op.ttl)
                .with_fingerprint(fingerprint);
            let outcome = self
                .store
                .claim(&claim)
                .await
                .map_err(|e| self.store_error("claim", e))?;
            let record = match outcome {
                ClaimOutcome::Acquired(lease) => return self.execute_claimed(lease, body).await,
                ClaimOutcome::Existing(record) => record,
            };
            if !fingerprints_agree(record.fingerprint.as_deref(), fingerprint) {
                return Err(self.error(|biz, key| Error::PayloadMismatch { biz, key }).into());
            }
            if record.status != Status::Processing {
                return self.answer_finished(record);
            }
            let remaining = wait_until.and_then(|until| until.checked_duration_since(Instant::now()));
            match remaining {
                Some(remaining) if !remaining.is_zero() => {
                    tokio::time::sleep(pause.min(remaining)).await;
                    pause = (pause * 2).min(WAIT_LONGEST_POLL);
                }
                _ => return Err(self.error(|biz, key| Error::InProgress { biz, key }).into()),
            }
        }
    }

    /// Step 1 of DESIGN §3, before anything touches the store: the biz, the key and the
    /// payload fingerprint.
    fn check_input(&self) -> Result<Option<&str>, Error> {
        if let Some(reason) = biz_problem(&self.op.biz) {
            return Err(Error::InvalidBiz {
                biz: self.op.biz.to_string(),
                reason,
            });
        }
        if let Some(reason) = key_problem(&self.key) {
            return Err(self.error(|biz, key| Error::InvalidKey { biz, key, reason }));
        }
        match &self.op.fingerprint {
            None => Ok(None),
            Some(Ok(fingerprint)) => Ok(Some(fingerprint)),
            Some(Err(message)) => Err(self.error(|biz, key| Error::Encode {
                biz,
                key,
                what: "payload",
                source: serde_json::Error::custom(message),
            })),
        }
    }

    /// A finished record answers the duplicate.
    fn answer_finished<T: DeserializeOwned, E: From<Error>>(&self, record: Record) -> Result<T, E> {
        let error = match (record.status, self.op.mode) {
            (Status::Succeeded, Mode::ReturnFirst) => return self.replay(&record).map_err(E::from),
            (Status::Succeeded, Mode::Reject) => self.error(|biz, key| Error::Duplicate { biz, key }),
            _ => self.error(|biz, key| Error::PreviousFailed {
                biz,
                key,
                message: record.error_message.unwrap_or_default(),
            }),
        };
        Err(error.into())
    }

    fn replay<T: DeserializeOwned>(&self, record: &Record) -> Result<T, Error> {
        let decoded = match record.response_body.as_deref() {
            Some(json) => serde_json::from_str(json),
            None => Err(serde_json::Error::custom("the SUCCESS record has no response_body")),
        };
        decoded.map_err(|source| self.error(|biz, key| Error::Decode { biz, key, source }))
    }

    async fn execute_claimed<T, E, F>(&self, lease: Lease, body: F) -> Result<T, E>
    where
        T: Serialize,
        E: From<Error>,
        F: Future<Output = Result<T, E>>,
    {
        let context = Context::new(&self.op.biz, &self.key, lease.fence);
        let outcome = heartbeat::hold(self.store, &lease, self.op.lease, context.scope(body)).await;
        match outcome {
            Ok(value) => self.record_success(&lease, value).await.map_err(E::from),
            Err(error) => {
                self.record_failure::<E>(&lease).await;
                Err(error)
            }
        }
    }

    /// Step 4 of DESIGN §3: store the response before returning it.
    async fn record_success<T: Serialize>(&self, lease: &Lease, value: T) -> Result<T, Error> {
        let json = match serde_json::to_string(&value) {
            Ok(json) => json,
            Err(source) => {
                // The body ran: keep duplicates from running it again.
                let message = format!("the response could not be encoded: {source}");
                self.write_after_failure(
                    "fail",
                    self.store.fail(lease, &message, clock::now(), self.op.ttl).await,
                    lease,
                );
                return Err(self.error(|biz, key| Error::Encode {
                    biz,
                    key,
                    what: "response",
                    source,
                }));
            }
        };
        // The body ran: keep trying to record it while the lease is surely ours, so a
        // store that comes back within that time does not let a retry run it again.
        let give_up = Instant::now() + self.op.lease / 2;
        let mut pause = COMPLETE_FIRST_RETRY;
        loop {
            match self.store.complete(lease, &json, clock::now(), self.op.ttl).await {
                Ok(FenceCheck::Held) => return Ok(value),
                Ok(FenceCheck::Lost) => {
                    let error = self.lease_lost(lease, "complete");
                    tracing::warn!(%error, "idempotent call finished after losing its claim");
                    return Err(error);
                }
                Err(source) if Instant::now() + pause < give_up => {
                    tracing::warn!(error = %source, biz = %self.op.biz, key = %self.key, "could not record a finished call; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(COMPLETE_LONGEST_RETRY);
                }
                Err(source) => return Err(self.store_error("complete", source)),
            }
        }
    }

    /// The body returned `Err`: release or record, per `on_error`. The caller gets its
    /// own error back whatever happens here; problems are logged.
    async fn record_failure<E>(&self, lease: &Lease) {
        let (operation, written) = match self.op.on_error {
            OnError::Release => ("release", self.store.release(lease).await),
            OnError::Record => {
                let message = format!("the call returned an error of type `{}`", std::any::type_name::<E>());
                (
                    "fail",
                    self.store.fail(lease, &message, clock::now(), self.op.ttl).await,
                )
            }
        };
        self.write_after_failure(operation, written, lease);
    }

    fn write_after_failure(&self, operation: &'static str, written: Result<FenceCheck, StoreError>, lease: &Lease) {
        match written {
            Ok(FenceCheck::Held) => {}
            Ok(FenceCheck::Lost) => {
                let error = self.lease_lost(lease, operation);
                tracing::warn!(%error, "idempotent call failed after losing its claim");
            }
            Err(source) => {
                let error = self.store_error(operation, source);
                tracing::warn!(%error, "could not record the outcome of a failed idempotent call");
            }
        }
    }

    fn lease_lost(&self, lease: &Lease, operation: &'static str) -> Error {
        self.error(|biz, key| Error::LeaseLost {
            biz,
            key,
            fence: lease.fence,
            operation,
        })
    }

    fn store_error(&self, operation: &'static str, source: StoreError) -> Error {
        self.error(|biz, key| Error::Store {
            biz,
            key,
            operation,
            source,
        })
    }

    fn error(&self, make: impl FnOnce(String, String) -> Error) -> Error {
        make(self.op.biz.to_string(), self.key.clone())
    }
}
