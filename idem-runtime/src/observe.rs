//! What an operator sees of the calls: a `tracing` span per call with events at the
//! turns that matter, and — feature `metrics` — counters and histograms through the
//! [`metrics`](https://docs.rs/metrics) facade.
//!
//! Levels: a healthy call logs nothing above `DEBUG` (the span, the claim, the replay,
//! a wait, an in-progress answer); `INFO` for what a client did wrong (a payload
//! mismatch) and for a takeover (a holder died or stalled); `WARN` for lost leases,
//! store failures and an effect whose outcome is unknown.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `idem_calls_total` | counter | `biz`, `outcome`: `executed`, `failed` (the body returned `Err`), `replayed`, `rejected` (`Mode::Reject`, or an answer of which only a digest is kept), `in_progress`, `payload_mismatch`, `previous_failed`, `gone` (a tombstone: expired or erased), `outcome_unknown` (a duplicate of an unsettled record, or a call that failed closed), `store_error`, `invalid` |
//! | `idem_waits_total` | counter | `biz`: duplicates that waited for a running call |
//! | `idem_takeovers_total` | counter | `biz`: claims that took a record over after its lease |
//! | `idem_lease_lost_total` | counter | `biz`: holders whose outcome was refused by the fence |
//! | `idem_outcome_unknown_total` | counter | `biz`: effects whose outcome was unknown and that failed closed (each leaves a record to settle) |
//! | `idem_reconciled_total` | counter | `biz`, `found` (`done`, `not_done`): lookups that settled an unknown outcome |
//! | `idem_store_errors_total` | counter | `biz`, `operation` (`claim`, `get`, `renew`, `complete`, `fail`, `release`) |
//! | `idem_claim_seconds` | histogram | `biz`: from the first claim statement to the key held or answered |
//! | `idem_body_seconds` | histogram | `biz`: the body's run |
//!
//! Transactional calls (`tx = …`, `execute_in`) count the same, without a span or the
//! body histogram (their two halves are separate calls of the caller's).
//!
//! Never labelled by key: keys are unbounded, and can be personal data (an e-mail, a
//! phone number, an order number that names a person). For the same reason spans and
//! log events show a key as `sha256:` and the first 16 hex digits of its SHA-256, by
//! default: two keys still tell apart, and the key you are looking for is found by its
//! hash (`printf %s "$KEY" | sha256sum | cut -c1-16`, or [`shown_key`]). Where keys are
//! opaque (UUIDs a client minted), [`hash_keys_in_traces`]`(false)` shows them as given.
//! An effect key (`biz:key:step:attempt`) names the key, and is shown the same way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::field::Empty;

use crate::error::Error;

/// A business namespace as the operation holds it: a `&'static str` label costs no
/// allocation per call.
type Biz = std::borrow::Cow<'static, str>;

static HASH_KEYS: AtomicBool = AtomicBool::new(true);

/// Whether spans and log events show keys (and effect keys) hashed, as
/// `sha256:<first 16 hex digits>` — the default, for keys that may be personal data —
/// or as given (`false`), process-wide.
pub fn hash_keys_in_traces(hash: bool) {
    HASH_KEYS.store(hash, Ordering::Relaxed);
}

/// A key (or an effect key) as idem's spans and log events show it: hashed, unless
/// [`hash_keys_in_traces`]`(false)` was asked for. For an application's own log lines
/// about a call, so they name its key the way idem's do.
///
/// ```
/// let shown = idem_runtime::observe::shown_key("ada@example.com").to_string();
/// assert!(shown.starts_with("sha256:") && !shown.contains("ada"));
/// ```
pub fn shown_key(key: &str) -> ShownKey<'_> {
    ShownKey(key)
}

/// A key as [`shown_key`] shows it (`Display`).
#[derive(Debug, Clone, Copy)]
pub struct ShownKey<'a>(&'a str);

impl std::fmt::Display for ShownKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if HASH_KEYS.load(Ordering::Relaxed) {
            write!(f, "sha256:{}", &crate::digest::sha256_hex(self.0)[..16])
        } else {
            f.write_str(self.0)
        }
    }
}

/// How a call ended, as the `outcome` label and span field say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Executed,
    Failed,
    Replayed,
    Rejected,
    InProgress,
    PayloadMismatch,
    PreviousFailed,
    Gone,
    Unknown,
    StoreError,
    Invalid,
}

impl Outcome {
    /// Every outcome, in the order of the enum (an outcome's index is its discriminant).
    #[cfg(feature = "metrics")]
    const ALL: [Outcome; 11] = [
        Outcome::Executed,
        Outcome::Failed,
        Outcome::Replayed,
        Outcome::Rejected,
        Outcome::InProgress,
        Outcome::PayloadMismatch,
        Outcome::PreviousFailed,
        Outcome::Gone,
        Outcome::Unknown,
        Outcome::StoreError,
        Outcome::Invalid,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Outcome::Executed => "executed",
            Outcome::Failed => "failed",
            Outcome::Replayed => "replayed",
            Outcome::Rejected => "rejected",
            Outcome::InProgress => "in_progress",
            Outcome::PayloadMismatch => "payload_mismatch",
            Outcome::PreviousFailed => "previous_failed",
            Outcome::Gone => "gone",
            Outcome::Unknown => "outcome_unknown",
            Outcome::StoreError => "store_error",
            Outcome::Invalid => "invalid",
        }
    }

    /// The outcome of a call that ended with `error` before its body ran.
    pub(crate) fn refused(error: &Error) -> Self {
        match error {
            Error::Duplicate { .. } | Error::AnswerNotKept { .. } => Outcome::Rejected,
            Error::InProgress { .. } => Outcome::InProgress,
            Error::PayloadMismatch { .. } => Outcome::PayloadMismatch,
            Error::PreviousFailed { .. } => Outcome::PreviousFailed,
            Error::Expired { .. } | Error::Erased { .. } => Outcome::Gone,
            Error::OutcomeUnknown { .. } => Outcome::Unknown,
            Error::Store { .. } | Error::Decode { .. } => Outcome::StoreError,
            _ => Outcome::Invalid,
        }
    }
}

/// The span of one call of `biz` for `key`: `fence` and `outcome` are filled in as the
/// call goes. None while no `tracing` subscriber was ever set: such a span would only
/// be written to the `log` crate (tracing's `log` feature, which sqlx turns on) at its
/// every entry and exit, and idem's events reach `log` without it.
pub(crate) fn call_span(biz: &str, key: &str) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none();
    }
    let span = tracing::debug_span!(target: "idem", "idem.call", biz, key = Empty, fence = Empty, outcome = Empty);
    if !span.is_disabled() {
        span.record("key", shown_key(key).to_string().as_str());
    }
    span
}

/// Whether a metrics recorder is listening: the thread's local recorder or the global
/// one. Without one, `metrics` answers with its no-op recorder — a type of no size — and
/// the label keys are not built at all (they cost a few hundred nanoseconds a call).
#[cfg(feature = "metrics")]
fn recording() -> bool {
    metrics::with_recorder(|recorder| std::mem::size_of_val(recorder) != 0)
}

/// The metric keys of a call's common turns, built once per thread and business
/// namespace instead of on every call (a key's labels are an allocation, and its hash is
/// computed as it is built). Keys, not the recorder's handles: a thread's local recorder
/// can change between calls, and each registers the key with the recorder of the moment.
#[cfg(feature = "metrics")]
mod keys {
    use std::cell::RefCell;
    use std::rc::Rc;

    use metrics::{Key, Label, Metadata};

    use super::{Biz, Outcome};

    /// What the `metrics` macros would say of these metrics: their target and level.
    pub(super) static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

    /// How many namespaces a thread keeps keys for; past that, the oldest goes.
    const KEPT: usize = 16;

    /// The keys of one business namespace.
    pub(super) struct Keys {
        biz: Biz,
        pub(super) calls: [Key; Outcome::ALL.len()],
        pub(super) claim_seconds: Key,
        pub(super) body_seconds: Key,
        pub(super) waits: Key,
        pub(super) takeovers: Key,
        pub(super) lease_lost: Key,
    }

    impl Keys {
        fn of(biz: &Biz) -> Self {
            let labelled = |name: &'static str| Key::from_parts(name, vec![Label::new("biz", biz.clone())]);
            Keys {
                biz: biz.clone(),
                calls: Outcome::ALL.map(|outcome| {
                    Key::from_parts(
                        "idem_calls_total",
                        vec![Label::new("biz", biz.clone()), Label::new("outcome", outcome.label())],
                    )
                }),
                claim_seconds: labelled("idem_claim_seconds"),
                body_seconds: labelled("idem_body_seconds"),
                waits: labelled("idem_waits_total"),
                takeovers: labelled("idem_takeovers_total"),
                lease_lost: labelled("idem_lease_lost_total"),
            }
        }
    }

    thread_local! {
        static KEPT_KEYS: RefCell<Vec<Rc<Keys>>> = const { RefCell::new(Vec::new()) };
    }

    /// The keys of `biz`, from this thread's cache or built now.
    pub(super) fn of(biz: &Biz) -> Rc<Keys> {
        KEPT_KEYS.with(|kept| {
            let mut kept = kept.borrow_mut();
            if let Some(keys) = kept.iter().find(|keys| keys.biz == *biz) {
                return keys.clone();
            }
            if kept.len() == KEPT {
                kept.remove(0);
            }
            let keys = Rc::new(Keys::of(biz));
            kept.push(keys.clone());
            keys
        })
    }
}

/// Add one to the counter `key`, with the recorder of the moment.
#[cfg(feature = "metrics")]
fn count(key: &metrics::Key) {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &keys::METADATA).increment(1));
}

/// Record `value` in the histogram `key`, with the recorder of the moment.
#[cfg(feature = "metrics")]
fn record(key: &metrics::Key, value: Duration) {
    metrics::with_recorder(|recorder| {
        recorder
            .register_histogram(key, &keys::METADATA)
            .record(value.as_secs_f64())
    });
}

/// Fill in `field` of the call's span, where there can be one (see [`call_span`]).
fn in_call_span(field: &str, value: impl tracing::Value) {
    if tracing::dispatcher::has_been_set() {
        tracing::Span::current().record(field, value);
    }
}

/// The key is held, with `fence`; `took_over` when the claim took a record over.
pub(crate) fn claimed(biz: &Biz, fence: u64, took_over: bool, claiming: Duration) {
    in_call_span("fence", fence);
    if took_over {
        tracing::info!(target: "idem", biz = &**biz,
            fence,
            "idem: took the key over after its holder's lease lapsed"
        );
        #[cfg(feature = "metrics")]
        if recording() {
            count(&keys::of(biz).takeovers);
        }
    } else {
        tracing::debug!(target: "idem", biz = &**biz, fence, "idem: claimed");
    }
    claim_time(biz, claiming);
}

/// How long admission took, to the key held or the call answered.
pub(crate) fn claim_time(biz: &Biz, claiming: Duration) {
    #[cfg(feature = "metrics")]
    if recording() {
        record(&keys::of(biz).claim_seconds, claiming);
    }
    let _ = (biz, claiming);
}

/// A duplicate waits for the running call.
pub(crate) fn waiting(biz: &Biz) {
    tracing::debug!(target: "idem", biz = &**biz, "idem: waiting for the running call");
    #[cfg(feature = "metrics")]
    if recording() {
        count(&keys::of(biz).waits);
    }
}

/// The call ended with `outcome`; its body ran for `body`, if it ran.
pub(crate) fn finished(biz: &Biz, outcome: Outcome, body: Option<Duration>) {
    let label = outcome.label();
    in_call_span("outcome", label);
    match outcome {
        Outcome::PayloadMismatch => tracing::info!(target: "idem", biz = &**biz,
            outcome = label,
            "idem: the key was used with another payload"
        ),
        Outcome::StoreError => tracing::warn!(target: "idem", biz = &**biz, outcome = label, "idem: the store failed"),
        _ => tracing::debug!(target: "idem", biz = &**biz, outcome = label, "idem: call ended"),
    }
    #[cfg(feature = "metrics")]
    if recording() {
        let keys = keys::of(biz);
        count(&keys.calls[outcome as usize]);
        if let Some(body) = body {
            record(&keys.body_seconds, body);
        }
    }
    let _ = body;
}

/// A store call failed at `operation`.
pub(crate) fn store_failed(biz: &Biz, operation: &'static str) {
    #[cfg(feature = "metrics")]
    if recording() {
        metrics::counter!("idem_store_errors_total", "biz" => biz.clone(), "operation" => operation).increment(1);
    }
    let _ = (biz, operation);
}

/// A holder's outcome was refused by the fence.
pub(crate) fn lease_lost(biz: &Biz) {
    #[cfg(feature = "metrics")]
    if recording() {
        count(&keys::of(biz).lease_lost);
    }
    let _ = biz;
}

/// An effect's outcome is unknown, and its call failed closed: a record waits to be
/// settled.
pub(crate) fn outcome_unknown(biz: &str, step: &str, effect_key: &str) {
    tracing::warn!(target: "idem", biz, step, effect_key = %shown_key(effect_key),
        "idem: the effect's outcome is unknown; the record waits to be settled (idem unknown, idem settle)"
    );
    #[cfg(feature = "metrics")]
    if recording() {
        metrics::counter!("idem_outcome_unknown_total", "biz" => biz.to_owned()).increment(1);
    }
}

/// A lookup settled an effect whose outcome was unknown: `found` is `done` or `not_done`.
pub(crate) fn reconciled(biz: &str, found: &'static str) {
    tracing::info!(target: "idem", biz, found, "idem: reconciled an effect whose outcome was unknown");
    #[cfg(feature = "metrics")]
    if recording() {
        metrics::counter!("idem_reconciled_total", "biz" => biz.to_owned(), "found" => found).increment(1);
    }
}

/// How many keys callers are waiting on in this process. The waiters of one key share
/// one reader of the store; a key leaves this count when its last waiter is answered,
/// fails or is dropped.
pub fn waited_keys() -> usize {
    crate::call::open_flights()
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::Outcome;

    /// The key of an outcome's count is found at its discriminant.
    #[test]
    fn every_outcome_is_at_its_own_index() {
        for (index, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome as usize, index, "{outcome:?}");
        }
    }
}
