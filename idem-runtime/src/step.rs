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

use std::time::Duration;

use crate::claim::{FenceCheck, Lease};
use crate::clock;
use crate::context::{context, Context};
use crate::error::{Error, StoreError};
use crate::observe;
use crate::replay::encode;
use crate::store::IdempotencyStore;
use crate::unknown::{Entry, Intent, Lookup, BODY, UNRECORDABLE};

/// How often a finished step's value is offered to the store before the step fails:
/// its effect has happened, and an unrecorded step runs again on the next attempt.
const RECORD_ATTEMPTS: u32 = 3;
const RECORD_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Where the steps of one running call are kept: the call's store, and what this call
/// has read and written of them.
#[derive(Debug)]
pub(crate) struct StepLog {
    store: Arc<dyn IdempotencyStore>,
    /// The lease's length as the holder counts it: how long a lookup is retried.
    lease_for: Duration,
    /// Every step must declare what to do when its outcome is unknown.
    policy_required: bool,
    state: Mutex<StepState>,
}

#[derive(Debug, Default)]
struct StepState {
    /// The recorded steps, once read from the record (at the first step).
    recorded: Option<BTreeMap<String, String>>,
    /// The names this call has used.
    used: HashSet<String>,
    /// An effect of this call whose outcome is unknown: the record is to stay unsettled.
    unknown: Option<Intent>,
}

impl StepLog {
    pub(crate) fn new(store: Arc<dyn IdempotencyStore>, lease_for: Duration, policy_required: bool) -> Self {
        Self {
            store,
            lease_for,
            policy_required,
            state: Mutex::default(),
        }
    }

    /// The effect whose outcome a step of this call found unknown, if one did: the call
    /// then leaves its record unsettled, whatever its body returned.
    pub(crate) async fn unknown(&self) -> Option<Intent> {
        // The body is done: the lock is free, unless a task it spawned holds it.
        match self.state.try_lock() {
            Ok(state) => state.unknown.clone(),
            Err(_) => self.state.lock().await.unknown.clone(),
        }
    }
}

/// The steps of the call whose body runs on this task: its context, which has a step
/// log.
#[derive(Debug)]
struct Steps {
    context: Context,
}

impl Steps {
    fn lease(&self) -> &Lease {
        self.context.lease()
    }

    fn log(&self) -> &StepLog {
        self.context
            .step_log()
            .expect("steps are made only of a context with a step log")
    }

    /// The error `make` builds from the call's biz and key.
    fn about(&self, make: impl FnOnce(String, String) -> Error) -> Error {
        make(self.lease().biz.clone(), self.lease().key.clone())
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
        let fence = self.lease().fence;
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
                self.lease().biz,
                self.lease().key
            ),
        }
    }

    fn undecodable(&self, source: serde_json::Error) -> Error {
        self.about(|biz, key| Error::Decode {
            biz,
            key,
            source: Box::new(source),
        })
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
    async fn begin(&self, name: &str, body: bool) -> Result<Option<Entry>, Error> {
        let mut state = self.log().state.lock().await;
        if name == BODY && !body {
            return Err(Error::InvalidStep {
                step: String::new(),
                reason: "a step needs a name (the empty name stands for the whole body)".to_owned(),
            });
        }
        if !state.used.insert(name.to_owned()) {
            return Err(Error::InvalidStep {
                step: name.to_owned(),
                reason: format!(
                    "biz `{}` key `{}` already ran a step of that name in this call; step names are unique \
                     within a call (a repeated name would replay the first step's value)",
                    self.lease().biz,
                    self.lease().key
                ),
            });
        }
        if state.recorded.is_none() {
            state.recorded = Some(self.read().await?);
        }
        Ok(state
            .recorded
            .as_ref()
            .and_then(|steps| steps.get(name))
            .map(|entry| Entry::read(entry)))
    }

    /// The steps recorded in this life of the record, if this call still holds it.
    async fn read(&self) -> Result<BTreeMap<String, String>, Error> {
        let record = self
            .log()
            .store
            .get(&self.lease().biz, &self.lease().key)
            .await
            .map_err(|e| self.error("get", e))?;
        match record {
            Some(record) if self.lease().holds(&record) => {
                record.steps_map().map_err(|source| self.undecodable(source))
            }
            _ => Err(self.lost()),
        }
    }

    /// Record `value` (JSON) as the outcome of step `name`.
    async fn finish(&self, name: &str, value: String) -> Result<(), Error> {
        self.write(name, Some(value)).await
    }

    /// Record that step `name`'s effect is about to start.
    async fn intend(&self, intent: &Intent) -> Result<(), Error> {
        self.write(&intent.step, Some(Entry::intended(intent))).await
    }

    /// Take step `name`'s intent back: its effect did not happen.
    async fn forget(&self, name: &str) -> Result<(), Error> {
        self.write(name, None).await
    }

    /// Record that `intent`'s outcome is unknown, and fail closed: the call leaves its
    /// record unsettled. The error, when the record says so.
    async fn fail_closed(&self, intent: Intent) -> Error {
        if let Err(error) = self.write(&intent.step, Some(Entry::unknown(&intent))).await {
            // Not recorded: the intent stays, and the next attempt decides again.
            return error;
        }
        let error = unknown_error(self.lease(), &intent);
        observe::outcome_unknown(&self.lease().biz, &intent.step, &intent.effect_key);
        self.log().state.lock().await.unknown = Some(intent);
        error
    }

    /// Write step `name`'s entry (`None`: remove it) into the recorded steps.
    async fn write(&self, name: &str, entry: Option<String>) -> Result<(), Error> {
        let mut state = self.log().state.lock().await;
        let mut steps = state.recorded.clone().unwrap_or_default();
        match entry {
            Some(value) => steps.insert(name.to_owned(), value),
            None => steps.remove(name),
        };
        let json = serde_json::to_string(&steps).map_err(|e| self.unencodable("steps", e))?;
        let mut attempt = 1;
        loop {
            match self.log().store.record_steps(self.lease(), &json).await {
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
    Step::new(name).run(effect).await
}

/// A lookup, type-erased: the effect's value if it happened, or why it could not tell.
type LookupFn<'a, T> = Box<dyn Fn(Intent) -> BoxFuture<'a, Result<Lookup<T>, String>> + Send + Sync + 'a>;
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a step does when it finds its effect begun but not finished.
enum OnUnknown<'a, T> {
    /// Run the effect again (the downstream deduplicates by the effect key).
    Rerun,
    /// Ask the lookup.
    Reconcile(LookupFn<'a, T>),
    /// Fail with [`Error::OutcomeUnknown`] and leave the record unsettled.
    FailClosed,
}

/// A step with a declared policy for an unknown outcome: [`step`] with options.
///
/// [`step`] runs an effect again when an earlier attempt started it and died before
/// recording its value — right only when the other side deduplicates by
/// [`Context::effect_key`](crate::Context::effect_key). A `Step` that declares
/// [`reconcile`](Self::reconcile) or [`fail_closed`](Self::fail_closed) first records
/// its [`Intent`] with the record (one fenced write), then starts the effect; an attempt
/// that finds the intent without a value asks the lookup, or fails closed, and never
/// runs the effect blindly. An effect that returns an error that may mean "it happened
/// and the answer was lost" (a timeout, a reset connection; by default *every* error,
/// narrowed with [`ambiguous_if`](Self::ambiguous_if)) is treated the same way at once,
/// in the same call.
///
/// ```
/// use std::sync::Arc;
/// use idem_runtime::{context, Idempotent, Lookup, MemoryStore, Step};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_runtime::Error> {
/// let pay = Idempotent::new("pay").store(Arc::new(MemoryStore::new()));
/// let charged: u32 = pay
///     .execute("order-7", async {
///         let reference = context().expect("inside the call").effect_key("charge");
///         Step::new("charge")
///             // Asked only when an earlier attempt may have charged: did the bank
///             // charge this reference?
///             .reconcile(|intent| async move {
///                 let _ = intent.effect_key; // look it up at the bank
///                 Ok::<_, std::io::Error>(Lookup::NotDone)
///             })
///             .run(async move {
///                 let _ = reference; // send the charge with it
///                 Ok::<_, idem_runtime::Error>(199)
///             })
///             .await
///     })
///     .await?;
/// assert_eq!(charged, 199);
/// # Ok(()) }
/// ```
pub struct Step<'a, T, E> {
    name: &'a str,
    /// The whole body ([`Step::body`]), not a step of it.
    body: bool,
    on_unknown: OnUnknown<'a, T>,
    ambiguous: Box<dyn Fn(&E) -> bool + Send + Sync + 'a>,
}

impl<T, E> std::fmt::Debug for Step<'_, T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let policy = match self.on_unknown {
            OnUnknown::Rerun => "rerun",
            OnUnknown::Reconcile(_) => "reconcile",
            OnUnknown::FailClosed => "fail closed",
        };
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("on_unknown", &policy)
            .finish()
    }
}

impl<'a, T, E> Step<'a, T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    /// The step `name`, unique within a call; without a policy it behaves as [`step`]
    /// (the effect runs again when its outcome is unknown).
    pub fn new(name: &'a str) -> Self {
        Self {
            name,
            body: false,
            on_unknown: OnUnknown::Rerun,
            ambiguous: Box::new(|_| true),
        }
    }

    /// The whole body of the call as one effect: what `#[idempotent(on_takeover = ..)]`
    /// wraps the body in. With a policy, its intent is recorded before the body starts
    /// (one write), and a call that takes the record over from a holder that died
    /// mid-body asks the lookup — about [`Context::life_key`](crate::Context::life_key),
    /// which the body hands the other service — or fails closed, instead of running the
    /// body again. Its value is the call's response, recorded as every response is (no
    /// write of its own). The body's `Err` is its own verdict (nothing happened, or it
    /// says so itself): the intent is taken back and `on_error` applies.
    pub fn body() -> Self {
        Self {
            body: true,
            ambiguous: Box::new(|_| false),
            ..Self::new(BODY)
        }
    }

    /// When the effect may have happened (an earlier attempt started it and died, or it
    /// returned an [ambiguous](Self::ambiguous_if) error), ask `lookup`: it gets the
    /// [`Intent`] (the effect key the request carried) and answers [`Lookup::Done`]
    /// (recorded and returned, the effect not run), [`Lookup::NotDone`] (the effect
    /// runs) or [`Lookup::CannotTell`] (fail closed). A lookup that returns `Err` is
    /// tried again, pausing 50 ms and doubling up to 2 s, for as long as the lease
    /// (then the step fails closed); it runs only while this call holds the key.
    pub fn reconcile<F, Fut, LE>(mut self, lookup: F) -> Self
    where
        F: Fn(Intent) -> Fut + Send + Sync + 'a,
        Fut: Future<Output = Result<Lookup<T>, LE>> + Send + 'a,
        LE: std::fmt::Display,
    {
        self.on_unknown = OnUnknown::Reconcile(Box::new(move |intent| {
            let found = lookup(intent);
            Box::pin(async move { found.await.map_err(|error| error.to_string()) })
        }));
        self
    }

    /// When the effect may have happened, fail with [`Error::OutcomeUnknown`] and leave
    /// the record unsettled: every duplicate gets the same error, and nothing runs the
    /// effect, until an operator settles it (`idem settle`).
    pub fn fail_closed(mut self) -> Self {
        self.on_unknown = OnUnknown::FailClosed;
        self
    }

    /// Which of the effect's errors leave its outcome unknown (a timeout, a connection
    /// reset after the request was sent). Without it, every error does: a step with a
    /// policy never takes an error for "it did not happen" unless told so. An error
    /// this says is definite is returned, and the intent is taken back, so the next
    /// attempt runs the effect.
    pub fn ambiguous_if(mut self, ambiguous: impl Fn(&E) -> bool + Send + Sync + 'a) -> Self {
        self.ambiguous = Box::new(ambiguous);
        self
    }

    /// Run `effect` once per life of the call's record, under this step's policy.
    ///
    /// # Errors
    ///
    /// Those of [`step`], and [`Error::OutcomeUnknown`] when the step fails closed.
    pub async fn run<F>(self, effect: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let log = log_of(self.name)?;
        let context = &log.context;
        let name = self.name;
        let declared = !matches!(self.on_unknown, OnUnknown::Rerun);
        if log.log().policy_required && !declared && !self.body {
            return Err(Error::InvalidStep {
                step: name.to_owned(),
                reason: format!(
                    "biz `{}` requires every step to say what to do when its outcome is unknown, and this one \
                     says nothing: use `Step::new(\"{name}\").reconcile(lookup)` or `.fail_closed()`",
                    log.lease().biz
                ),
            }
            .into());
        }
        let mut attempt = 1;
        match log.begin(name, self.body).await? {
            None => {}
            Some(Entry::Value(json)) => {
                return serde_json::from_str(&json).map_err(|source| log.undecodable(source).into());
            }
            Some(Entry::Unrecordable(reason)) => return Err(log.ran_unrecorded(name, &reason).into()),
            Some(Entry::Unknown(intent)) => return Err(log.fail_closed(intent).await.into()),
            Some(Entry::Intended(intent)) => {
                attempt = intent.attempt + 1;
                if let Some(value) = self.settle(&log, intent).await? {
                    return Ok(value);
                }
            }
        }
        // The heartbeat learned that the key was taken over: the new holder runs this step;
        // running its effect here too would do it twice.
        if !context.lease_held() {
            return Err(log.lost().into());
        }
        let effect_key = if self.body {
            context.life_key()
        } else {
            context.effect_key(name)
        };
        let intent = Intent::new(name, effect_key, attempt, clock::now());
        if declared {
            log.intend(&intent).await?;
        }
        let value = match effect.await {
            Ok(value) => value,
            Err(error) if declared && (self.ambiguous)(&error) => {
                tracing::warn!(target: "idem", biz = %context.biz(), key = %crate::observe::shown_key(context.key()), step = name,
                    "the step's effect returned an error that leaves its outcome unknown; reconciling");
                return match self.settle(&log, intent).await? {
                    Some(value) => Ok(value),
                    // It did not happen: the intent is taken back with the error.
                    None => {
                        log.forget(name).await?;
                        Err(error)
                    }
                };
            }
            Err(error) => {
                if declared {
                    log.forget(name).await?;
                }
                return Err(error);
            }
        };
        if self.body {
            // The call records its response next; a holder that dies before that leaves
            // the intent, and its successor reconciles.
            return Ok(value);
        }
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

    /// `intent`'s effect may have happened: the value it had, recorded (`Some`), or
    /// `None` when the effect is to run (again) — or the error that fails closed.
    async fn settle(&self, log: &Steps, intent: Intent) -> Result<Option<T>, Error> {
        let lookup = match &self.on_unknown {
            OnUnknown::Rerun => return Ok(None),
            OnUnknown::FailClosed => return Err(log.fail_closed(intent).await),
            OnUnknown::Reconcile(lookup) => lookup,
        };
        // On tokio's clock, as the pauses between lookups.
        let deadline = tokio::time::Instant::now() + log.log().lease_for;
        let mut pause = LOOKUP_FIRST_PAUSE;
        loop {
            // Never beside a live holder: only while this call holds the key.
            if !log.context.lease_held() {
                return Err(log.lost());
            }
            let why = match lookup(intent.clone()).await {
                Ok(Lookup::Done(value)) => {
                    let json = encode(&value).map_err(|error| log.unencodable("step value", error))?;
                    log.finish(&intent.step, json).await?;
                    observe::reconciled(&log.lease().biz, "done");
                    return Ok(Some(value));
                }
                Ok(Lookup::NotDone) => {
                    observe::reconciled(&log.lease().biz, "not_done");
                    return Ok(None);
                }
                Ok(Lookup::CannotTell) => None,
                Err(error) => Some(error),
            };
            let Some(error) = why.filter(|_| tokio::time::Instant::now() + pause <= deadline) else {
                tracing::warn!(target: "idem", biz = %log.lease().biz, key = %crate::observe::shown_key(&log.lease().key), step = %intent.step,
                    "could not reconcile the step's effect; failing closed");
                return Err(log.fail_closed(intent).await);
            };
            tracing::debug!(target: "idem", step = %intent.step, %error, "the lookup failed; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LOOKUP_LONGEST_PAUSE);
        }
    }
}

/// Retrying a lookup that failed: first and longest pause.
const LOOKUP_FIRST_PAUSE: Duration = Duration::from_millis(50);
const LOOKUP_LONGEST_PAUSE: Duration = Duration::from_secs(2);

/// The error of a call whose `intent`'s outcome is unknown.
pub(crate) fn unknown_error(lease: &Lease, intent: &Intent) -> Error {
    Error::OutcomeUnknown {
        biz: lease.biz.clone(),
        key: lease.key.clone(),
        step: (intent.step != BODY).then(|| intent.step.clone()),
        effect_key: intent.effect_key.clone(),
        since: intent.since(),
    }
}

/// The steps of the call whose body runs on this task, or why `name` cannot run.
fn log_of(name: &str) -> Result<Steps, Error> {
    let invalid = |reason| Error::InvalidStep {
        step: name.to_owned(),
        reason,
    };
    let context = context().ok_or_else(|| {
        invalid("it was called outside an idempotent body: there is no record to keep it in".to_owned())
    })?;
    if context.step_log().is_none() {
        return Err(invalid(format!(
            "biz `{}` key `{}` runs in a transaction, which a step's record would roll back with; \
             pass `Context::effect_key(\"{name}\")` to the service instead",
            context.biz(),
            context.key()
        )));
    }
    Ok(Steps { context })
}
