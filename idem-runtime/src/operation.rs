//! `Idempotent`: an operation and its options (its biz, `ttl`, mode, lease, store,
//! payload). What executing it does is [`call`](crate::call).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::bounds::duration_problem;
use crate::default_store::{installed, IntoSharedStore};
use crate::error::Error;
use crate::fingerprint::fingerprint;
use crate::policy::{Mode, OnError};
use crate::replay::{pointer_problem, Kept};
use crate::retention::{AfterExpiry, Retention};
use crate::store::IdempotencyStore;

/// Default `ttl`: a finished record answers duplicates for a day.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Default `lease`: a claim is respected for 30 s without a heartbeat.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A payload copy larger than this is not kept in `request_body`, even when
/// [asked for](Idempotent::keep_request) (its fingerprint is).
pub const MAX_REQUEST_BODY: usize = 64 * 1024;

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
    pub(crate) biz: Cow<'static, str>,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
    pub(crate) lease: Duration,
    /// `None`: as long as the lease.
    pub(crate) clock_tolerance: Option<Duration>,
    pub(crate) on_error: OnError,
    /// Every step must declare a policy for an unknown outcome.
    pub(crate) outcome_policy_required: bool,
    pub(crate) wait: Option<Duration>,
    /// The payload, or why it could not be fingerprinted (reported at execute).
    pub(crate) payload: Option<Result<Payload, Arc<dyn std::error::Error + Send + Sync>>>,
    /// Keep the payload's JSON in the record beside its fingerprint.
    pub(crate) keep_request: bool,
    /// What of the answer (and of a kept request) is recorded.
    pub(crate) kept: Kept,
    /// The keyed hash of the call's data subject, when one was named.
    pub(crate) subject: Option<String>,
    /// What a retry after the record's `ttl` gets.
    pub(crate) after_expiry: AfterExpiry,
    /// The first option given an out-of-range value (reported at execute).
    pub(crate) invalid: Option<(&'static str, String)>,
    /// Why `biz` cannot name an operation (reported at execute), found once.
    pub(crate) biz_problem: Option<String>,
    store: Option<Arc<dyn IdempotencyStore>>,
}

/// What a declared payload leaves with the claim.
#[derive(Debug, Clone)]
pub(crate) struct Payload {
    pub(crate) fingerprint: String,
    /// Its JSON, when no larger than [`MAX_REQUEST_BODY`]; stored only when
    /// [asked for](Idempotent::keep_request).
    pub(crate) request_body: Option<String>,
    /// Whether its JSON was asked for when it was given (it is written only then).
    pub(crate) with_request: bool,
}

/// The JSON of `payload` as a record keeps it: none when it is larger than
/// [`MAX_REQUEST_BODY`].
fn request_json<P: Serialize + ?Sized>(payload: &P) -> Option<String> {
    serde_json::to_string(payload)
        .ok()
        .filter(|json| json.len() <= MAX_REQUEST_BODY)
}

impl Idempotent {
    /// An operation in the business namespace `biz`, with the defaults: `ttl` 24 h,
    /// `ReturnFirst`, `lease` 30 s (and as much [clock
    /// tolerance](Self::clock_tolerance)), `on_error = Release`, no `wait`, no payload
    /// (and none kept), the installed store.
    pub fn new(biz: impl Into<Cow<'static, str>>) -> Self {
        let biz = biz.into();
        Self {
            biz_problem: crate::key::operation_biz_problem(&biz),
            biz,
            ttl: DEFAULT_TTL,
            mode: Mode::ReturnFirst,
            lease: DEFAULT_LEASE,
            clock_tolerance: None,
            on_error: OnError::Release,
            outcome_policy_required: false,
            wait: None,
            payload: None,
            keep_request: false,
            kept: Kept::default(),
            subject: None,
            after_expiry: AfterExpiry::NewRequest,
            invalid: None,
            store: None,
        }
    }

    /// How long a finished record answers duplicates, counted from completion.
    /// Positive and at most [`MAX_DURATION`](crate::MAX_DURATION); another value makes
    /// every call fail with [`Error::InvalidOption`] before anything is claimed.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = self.checked("ttl", ttl);
        self
    }

    /// Refuse every [`step`](crate::step) of this operation that does not say what to do
    /// when its outcome is unknown ([`Step::reconcile`](crate::Step::reconcile) or
    /// [`Step::fail_closed`](crate::Step::fail_closed)): for money-moving operations,
    /// where nobody should forget. A step that declares nothing fails with
    /// [`Error::InvalidStep`] before its effect runs.
    pub fn require_outcome_policy(mut self) -> Self {
        self.outcome_policy_required = true;
        self
    }

    /// What a duplicate of a finished call gets.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a `Processing` claim is respected without a heartbeat. Positive and at
    /// most [`MAX_DURATION`](crate::MAX_DURATION), as `ttl`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = self.checked("lease", lease);
        self
    }

    /// How far the store's clock may jump ahead while a body runs without its lease
    /// being taken over early; by default as long as the lease.
    ///
    /// The store judges a lease by its own clock (the database server's, Redis's). A
    /// holder counts its lease on its own steady clock and renews it every third of its
    /// length, but the store keeps the claim for the lease *plus this tolerance* past
    /// each renewal, so a server whose clock steps forward mid-body — a failover to a
    /// standby whose clock is ahead, a server restarted with a wrong clock, another
    /// Galera node, a promoted Redis replica — does not hand a running claim to a
    /// duplicate. A forward jump ends a running lease early only when it is larger
    /// than the tolerance plus what was left of the lease when it happened: at least
    /// two thirds of the lease, less the time the holder could not reach the store.
    ///
    /// The price: a claim whose holder died is taken over the lease plus the
    /// tolerance after its last renewal, not the lease. `Duration::ZERO` takes over as
    /// soon as the store's clock says the lease lapsed (any forward jump larger than
    /// what is left of the lease then runs the body twice). At most
    /// [`MAX_DURATION`](crate::MAX_DURATION).
    pub fn clock_tolerance(mut self, tolerance: Duration) -> Self {
        // The durations' one rule, but zero is a tolerance (none).
        match duration_problem("clock_tolerance", tolerance).filter(|_| !tolerance.is_zero()) {
            None => self.clock_tolerance = Some(tolerance),
            Some(reason) => {
                self.invalid.get_or_insert(("clock_tolerance", reason));
            }
        }
        self
    }

    /// How long the store keeps a claim past its grant or a renewal: the lease plus
    /// the clock tolerance.
    pub(crate) fn stored_lease(&self) -> Duration {
        let tolerance = self.clock_tolerance.unwrap_or(self.lease);
        (self.lease + tolerance).min(crate::MAX_DURATION)
    }

    /// What happens to the claim when the body returns `Err`.
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// Let a duplicate that finds the first call still running wait up to `wait` for
    /// its outcome instead of failing at once with [`Error::InProgress`]. The wait is
    /// spent reading the record, never writing to it, and bounds the whole wait. Positive
    /// and at most [`MAX_DURATION`](crate::MAX_DURATION), as `ttl`.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(self.checked("wait", wait));
        self
    }

    /// `duration` if it is a valid value of `option`; else the default, with the
    /// problem kept to fail every call.
    fn checked(&mut self, option: &'static str, duration: Duration) -> Duration {
        match duration_problem(option, duration) {
            None => duration,
            Some(reason) => {
                self.invalid.get_or_insert((option, reason));
                DEFAULT_LEASE
            }
        }
    }

    /// Fingerprint `payload` and store it with the claim: the same key with another
    /// payload then fails with [`Error::PayloadMismatch`]. A payload that cannot be
    /// serialized fails the call with [`Error::Encode`] before anything is claimed.
    ///
    /// Equal payloads fingerprint equal and different ones differ: map and struct fields
    /// in any order, lists in their order (`[1, 2]` and `[2, 1]` are two payloads),
    /// integers of any width. A set is marked [`Unordered`](crate::Unordered) (or its
    /// field `#[serde(serialize_with = "idem::unordered")]`) to compare as a multiset.
    /// Only the fingerprint is stored, unless [`keep_request`](Self::keep_request) asked
    /// for the payload's JSON too (before this call: the JSON is written here).
    pub fn payload<P: Serialize + ?Sized>(mut self, payload: &P) -> Self {
        self.payload = Some(match fingerprint(payload) {
            Ok(fingerprint) => Ok(Payload {
                fingerprint,
                request_body: self.keep_request.then(|| request_json(payload)).flatten(),
                with_request: self.keep_request,
            }),
            Err(error) => Err(Arc::new(error)),
        });
        self
    }

    /// Keep the payload's JSON in the record's `request_body`, beside its fingerprint
    /// (when it is at most [`MAX_REQUEST_BODY`] bytes): for an operator reading the
    /// record (`idem show`), and for the HTTP layer, whose answer to a key reused for
    /// another request then names the fields that differ. Off by default: the
    /// fingerprint alone detects a changed payload, and a request often holds personal
    /// data that need not be kept for a day.
    ///
    /// Ask for it before [`payload`](Self::payload), which writes the JSON: asked for
    /// after a payload was given without it, every call fails with
    /// [`Error::InvalidOption`] before anything is claimed.
    pub fn keep_request(mut self, keep: bool) -> Self {
        self.keep_request = keep;
        if keep && matches!(&self.payload, Some(Ok(payload)) if !payload.with_request) {
            self.invalid.get_or_insert((
                "keep_request",
                "it was asked for after `payload(..)`, whose JSON was not kept: call `keep_request(true)` \
                 before `payload(..)`"
                    .to_owned(),
            ));
        }
        self
    }

    /// Keep the answer itself (`true`, the default), or only its digest (`false`):
    /// a duplicate then learns that the call succeeded — it never runs again — but gets
    /// [`Error::AnswerNotKept`] instead of the answer (behind the HTTP layer, 409
    /// `urn:idem:problem:response-not-replayable`). For answers that must not be kept
    /// at all (one-time credentials, statements).
    pub fn keep_answer(mut self, keep: bool) -> Self {
        self.kept.digest_only = !keep;
        self
    }

    /// Record the fields at these JSON pointers (RFC 6901: `/card/number`) of the answer
    /// and of a kept request as `"[redacted]"`: a duplicate is answered with the rest,
    /// and must deserialize with those fields so written (strings, or values that
    /// accept one). A pointer that does not start with `/` makes every call fail with
    /// [`Error::InvalidOption`] before anything is claimed.
    pub fn redact<P: Into<String>>(mut self, pointers: impl IntoIterator<Item = P>) -> Self {
        for pointer in pointers {
            let pointer = pointer.into();
            if let Some(reason) = pointer_problem(&pointer) {
                self.invalid.get_or_insert(("redact", reason));
            }
            self.kept.redacted.push(pointer);
        }
        self
    }

    pub(crate) fn request_body(&self) -> Option<String> {
        if !self.keep_request {
            return None;
        }
        match &self.payload {
            Some(Ok(payload)) => payload.request_body.clone().map(|json| self.kept.redact(json)),
            _ => None,
        }
    }

    /// Name the data subject of this call — the person its request and answer are
    /// about (a user id, an account number) — so that [`subject::erase`](crate::subject::erase)
    /// can later remove what its record keeps. Only a keyed hash of `subject` is
    /// stored, never the subject itself, computed with the installed
    /// [`SubjectKey`](crate::subject::SubjectKey) (or the one in `IDEM_SUBJECT_KEY`).
    /// With no key to be had the call fails with [`Error::InvalidOption`] before
    /// anything is claimed: an unkeyed hash of a user id is as good as the id.
    pub fn subject(mut self, subject: impl std::fmt::Display) -> Self {
        match crate::subject::installed_key() {
            Ok(key) => self.subject = Some(key.hash(&subject.to_string())),
            Err(reason) => {
                self.invalid.get_or_insert(("subject", reason));
            }
        }
        self
    }

    /// What a retry that arrives after the record's `ttl` gets: a new run
    /// ([`AfterExpiry::NewRequest`], the default) or, for the window of
    /// [`AfterExpiry::Gone`], [`Error::Expired`] from a body-less tombstone. The window
    /// is positive and at most [`MAX_DURATION`](crate::MAX_DURATION), as `ttl`.
    pub fn after_expiry(mut self, after: AfterExpiry) -> Self {
        self.after_expiry = match after {
            AfterExpiry::Gone(window) => AfterExpiry::Gone(self.checked("after_expiry", window)),
            AfterExpiry::NewRequest => AfterExpiry::NewRequest,
        };
        self
    }

    /// What this operation's finished records keep beyond their answer.
    pub(crate) fn retention(&self) -> Retention {
        Retention::new(self.subject.clone(), self.after_expiry)
    }

    /// Use `store` instead of the installed default.
    pub fn store(mut self, store: impl IntoSharedStore) -> Self {
        self.store = Some(store.into_shared());
        self
    }

    /// The store given to [`store`](Self::store), if one was.
    pub fn given_store(&self) -> Option<&Arc<dyn IdempotencyStore>> {
        self.store.as_ref()
    }

    /// The business namespace.
    pub fn biz(&self) -> &str {
        &self.biz
    }

    /// The store given to [`store`](Self::store), or the installed one.
    pub(crate) fn store_or_installed(&self) -> Result<Arc<dyn IdempotencyStore>, Error> {
        self.store.clone().or_else(installed).ok_or_else(|| Error::NoStore {
            biz: self.biz.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::MemoryStore;

    /// The payload's JSON is written when it is given: asked for first, it is kept;
    /// asked for after, every call is refused before its body runs, saying why.
    #[tokio::test]
    async fn keep_request_is_asked_for_before_the_payload() {
        let store = Arc::new(MemoryStore::new());
        let runs = AtomicU32::new(0);
        let body = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(1)
        };
        let kept = Idempotent::new("kept")
            .store(store.clone())
            .keep_request(true)
            .payload(&"charge 7");
        assert_eq!(kept.execute("k", body()).await.unwrap(), 1);
        let record = store.get("kept", "k").await.unwrap().unwrap();
        assert_eq!(record.request_body.as_deref(), Some("\"charge 7\""));

        let late = Idempotent::new("late")
            .store(store.clone())
            .payload(&"charge 7")
            .keep_request(true);
        let refused = late.execute("k", body()).await.unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidOption { option: "keep_request", reason, .. } if reason.contains("before `payload(..)`")),
            "{refused:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the refused call's body did not run");
        let unasked = Idempotent::new("unasked").store(store.clone()).payload(&"charge 7");
        assert_eq!(unasked.execute("k", body()).await.unwrap(), 1);
        let record = store.get("unasked", "k").await.unwrap().unwrap();
        assert_eq!(record.request_body, None, "not asked for: not kept");
    }
}
