//! Steps: recovery points for effects outside the store.
//!
//! A body that charges a card and then sends an SMS cannot put either in a database
//! transaction. If its process dies between the two, the takeover runs the body again
//! — and charges again. [`step`] records each finished effect's `Ok` value with the
//! record, fenced like every holder write, before the body goes on; a later attempt of
//! the same life (a takeover, or a retry after `on_error = Release`) gets the recorded
//! value back without running the effect again.
//!
//! The recorded steps are one JSON object in [`Record::steps`](crate::Record::steps),
//! read once per call (at its first step) and written whole after each step, under a
//! lock so that concurrent steps of one body (`join!`) never write an older map over a
//! newer one.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Mutex;

use crate::claim::{FenceCheck, Lease};
use crate::context::context;
use crate::error::{Error, StoreError};
use crate::replay::encode;
use crate::store::IdempotencyStore;

/// How often a finished step's value is offered to the store before the step fails:
/// its effect has happened, and an unrecorded step runs again on the next attempt.
const RECORD_ATTEMPTS: u32 = 3;
const RECORD_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// The steps of one running call.
#[derive(Debug)]
pub(crate) struct StepLog {
    store: Arc<dyn IdempotencyStore>,
    lease: Lease,
    state: Mutex<StepState>,
}

#[derive(Debug, Default)]
struct StepState {
    /// The recorded steps, once read from the record (at the first step).
    recorded: Option<BTreeMap<String, String>>,
    /// The names this call has used.
    used: HashSet<String>,
}

impl StepLog {
    pub(crate) fn new(store: Arc<dyn IdempotencyStore>, lease: Lease) -> Self {
        Self {
            store,
            lease,
            state: Mutex::default(),
        }
    }

    /// The error `make` builds from the call's biz and key.
    fn about(&self, make: impl FnOnce(String, String) -> Error) -> Error {
        make(self.lease.biz.clone(), self.lease.key.clone())
    }

    fn error(&self, operation: &'static str, source: StoreError) -> Error {
        self.about(|biz, key| Error::Store {
            biz,
            key,
            operation,
            source,
        })
    }

    fn lost(&self) -> Error {
        let fence = self.lease.fence;
        self.about(|biz, key| Error::LeaseLost {
            biz,
            key,
            fence,
            operation: "step",
        })
    }

    /// An earlier attempt ran step `name`'s effect and could not record its value.
    fn ran_unrecorded(&self, name: &str, reason: &str) -> Error {
        Error::InvalidStep {
            step: name.to_owned(),
            reason: format!(
                "an earlier attempt of biz `{}` key `{}` ran it, but its value could not be recorded ({reason}); \
                 it is not run again. Make the step's value one JSON can carry, and settle this record by hand \
                 (`idem show`, then `idem release` once the effect is reconciled)",
                self.lease.biz, self.lease.key
            ),
        }
    }

    fn undecodable(&self, source: serde_json::Error) -> Error {
        self.about(|biz, key| Error::Decode { biz, key, source })
    }

    fn unencodable(&self, what: &'static str, source: serde_json::Error) -> Error {
        self.about(|biz, key| Error::Encode {
            biz,
            key,
            what,
            source: Arc::new(source),
        })
    }

    /// Take `name` for this call and say what an earlier attempt recorded for it.
    async fn begin(&self, name: &str) -> Result<Option<String>, Error> {
        let mut state = self.state.lock().await;
        if !state.used.insert(name.to_owned()) {
            return Err(Error::InvalidStep {
                step: name.to_owned(),
                reason: format!(
                    "biz `{}` key `{}` already ran a step of that name in this call; step names are unique \
                     within a call (a repeated name would replay the first step's value)",
                    self.lease.biz, self.lease.key
                ),
            });
        }
        if state.recorded.is_none() {
            state.recorded = Some(self.read().await?);
        }
        Ok(state.recorded.as_ref().and_then(|steps| steps.get(name).cloned()))
    }

    /// The steps recorded in this life of the record, if this call still holds it.
    async fn read(&self) -> Result<BTreeMap<String, String>, Error> {
        let record = self
            .store
            .get(&self.lease.biz, &self.lease.key)
            .await
            .map_err(|e| self.error("get", e))?;
        match record {
            Some(record) if self.lease.holds(&record) => match record.steps.as_deref() {
                None => Ok(BTreeMap::new()),
                Some(json) => serde_json::from_str(json).map_err(|source| self.undecodable(source)),
            },
            _ => Err(self.lost()),
        }
    }

    /// Record `value` (JSON) as the outcome of step `name`.
    async fn finish(&self, name: &str, value: String) -> Result<(), Error> {
        let mut state = self.state.lock().await;
        let mut steps = state.recorded.clone().unwrap_or_default();
        steps.insert(name.to_owned(), value);
        let json = serde_json::to_string(&steps).map_err(|e| self.unencodable("steps", e))?;
        let mut attempt = 1;
        loop {
            match self.store.record_steps(&self.lease, &json).await {
                Ok(FenceCheck::Held) => {
                    state.recorded = Some(steps);
                    return Ok(());
                }
                Ok(FenceCheck::Lost) => return Err(self.lost()),
                Err(e) if attempt == RECORD_ATTEMPTS => return Err(self.error("record_steps", e)),
                Err(e) => {
                    tracing::debug!(target: "idem", error = %e, step = name, attempt, "recording a step failed; trying again");
                    tokio::time::sleep(RECORD_PAUSE * attempt).await;
                    attempt += 1;
                }
            }
        }
    }
}

/// Run `effect` once per life of the current call's record, as the step `name`.
///
/// Inside an idempotent body, an effect outside the store (a card charge, an SMS, a
/// message to another service) runs under `step`: its `Ok` value is recorded with the
/// record before `step` returns, fenced like the call's other writes. When the call is
/// run again for the same key — taken over after a crash, or retried after its body
/// returned `Err` with `on_error = Release` — a step that finished returns its recorded
/// value without running; the rest run. An `Err` from `effect` is returned and not
/// recorded, so the next attempt runs the step again.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{step, Idempotent, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_runtime::Error> {
/// let pay = Idempotent::new("pay").store(Arc::new(MemoryStore::new()));
/// let receipt: String = pay
///     .execute("order-7", async {
///         let charge: u32 = step("charge", async { Ok::<_, idem_runtime::Error>(199) }).await?;
///         step("sms", async { Ok::<_, idem_runtime::Error>(()) }).await?;
///         Ok::<_, idem_runtime::Error>(format!("charged {charge}"))
///     })
///     .await?;
/// assert_eq!(receipt, "charged 199");
/// # Ok(()) }
/// ```
///
/// A step does not start its effect once the call is known to have lost its lease
/// ([`Context::lease_held`](crate::Context::lease_held) is false): it fails with
/// [`Error::LeaseLost`] and the new holder runs it. A value that cannot be recorded
/// (NaN, ±∞, `Some(None)`, a map with non-string keys) fails the step with
/// [`Error::Encode`] after its effect ran, and the record keeps that the step ran: later
/// attempts fail with [`Error::InvalidStep`] instead of running the effect again.
///
/// A step's effect can still run twice in one case: the process dies after the effect
/// and before its value is recorded. Hand the downstream service
/// [`Context::effect_key(name)`](crate::Context::effect_key), which is the same on every
/// attempt of the life, so that it deduplicates that window too.
///
/// # Errors
///
/// [`Error::InvalidStep`] outside an idempotent body, in a transactional call (whose
/// writes roll back with the transaction: use `effect_key` there), or when `name` was
/// already used in this call — `effect` does not run. [`Error::LeaseLost`] when the call
/// was taken over; [`Error::Store`] when the store could not read or record the steps;
/// [`Error::Encode`]/[`Error::Decode`] for a value that does not round-trip through JSON.
pub async fn step<T, E, F>(name: &str, effect: F) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: Future<Output = Result<T, E>>,
{
    let (context, log) = log_of(name)?;
    let recorded = log.begin(name).await?;
    if let Some(json) = recorded {
        if let Some(reason) = json.strip_prefix(UNRECORDABLE) {
            return Err(log.ran_unrecorded(name, reason).into());
        }
        return serde_json::from_str(&json).map_err(|source| log.undecodable(source).into());
    }
    // The heartbeat learned that the key was taken over: the new holder runs this step;
    // running its effect here too would do it twice.
    if !context.lease_held() {
        return Err(log.lost().into());
    }
    let value = effect.await?;
    match encode(&value) {
        Ok(json) => log.finish(name, json).await?,
        Err(error) => {
            // The effect happened and its value cannot be kept: record that it ran, so
            // the next attempt fails instead of running it again.
            log.finish(name, format!("{UNRECORDABLE}{error}")).await?;
            return Err(log.unencodable("step value", error).into());
        }
    }
    Ok(value)
}

/// What a step's entry starts with when its effect ran and its value could not be
/// recorded (NaN, ±∞, a map with non-string keys, …), followed by why. No JSON text
/// starts with `!`, so it is never taken for a value.
const UNRECORDABLE: &str = "!unrecordable: ";

/// The context and step log of the call whose body runs on this task, or why `name`
/// cannot run.
fn log_of(name: &str) -> Result<(crate::context::Context, Arc<StepLog>), Error> {
    let invalid = |reason| Error::InvalidStep {
        step: name.to_owned(),
        reason,
    };
    let context = context().ok_or_else(|| {
        invalid("it was called outside an idempotent body: there is no record to keep it in".to_owned())
    })?;
    let log = context.steps().ok_or_else(|| {
        invalid(format!(
            "biz `{}` key `{}` runs in a transaction, which a step's record would roll back with; \
             pass `Context::effect_key(\"{name}\")` to the service instead",
            context.biz(),
            context.key()
        ))
    })?;
    Ok((context, log))
}
