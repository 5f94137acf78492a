//! The errors an idempotent call can end with.

use std::error::Error as StdError;

/// Why an idempotent call did not run its body, or could not record its outcome.
///
/// `Display` says what failed, in one line; the cause (the store's error, serde's)
/// is the error's [`source`](std::error::Error::source), not repeated in the message,
/// so an error reporter that walks the chain (`anyhow`'s `{:#}`, `tracing`'s error
/// fields) prints each cause once.
///
/// Every variant that concerns one record names its `biz` and `key`, so a log line is
/// enough to find the row in the `idempotent_record` table. The enum is
/// non-exhaustive: match the variants you act on and keep a fallback arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is empty, longer than 255 bytes or holds control characters.
    /// The body did not run.
    #[error("invalid idempotency key {key:?} for biz `{biz}`: {reason}")]
    InvalidKey {
        /// Business namespace of the call.
        biz: String,
        /// The key as given (may be long; `Debug`-escaped in the message).
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The business namespace is empty, longer than 64 characters or holds control
    /// characters. Only reachable through the builder: the attribute checks `biz` at
    /// compile time.
    #[error("invalid biz {biz:?}: {reason}")]
    InvalidBiz {
        /// The namespace as given.
        biz: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An option given to the builder is out of range (a zero or over-long duration).
    /// The attribute refuses the same values at compile time. Nothing was claimed.
    #[error("invalid option for biz `{biz}`: {reason}")]
    InvalidOption {
        /// Business namespace of the operation.
        biz: String,
        /// The option: `ttl`, `lease` or `wait`.
        option: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// A form token was consumed before: this submission is a duplicate.
    #[error("token for biz `{biz}` was already used: this submission is a duplicate")]
    TokenSpent {
        /// Business namespace the token was issued for.
        biz: String,
    },
    /// A form token this store never issued for `biz`, or whose time ran out.
    #[error("token for biz `{biz}` is unknown or expired")]
    TokenUnknown {
        /// Business namespace the token was presented for.
        biz: String,
    },
    /// The body of an idempotent call for `(biz, key)` called an idempotent fn with the
    /// same `(biz, key)`: it would wait on its own claim. Nothing was claimed.
    #[error(
        "biz `{biz}` key `{key}` was called again from inside its own body; \
         the inner call would wait on the outer one's claim: use another biz or key for the inner call"
    )]
    Reentrant {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// [`step`](crate::step) was used where it cannot record anything: outside an
    /// idempotent body, in a transactional call, or under a name already used in this
    /// call. The step's future did not run.
    #[error("step `{step}` cannot run: {reason}")]
    InvalidStep {
        /// The step's name.
        step: String,
        /// Why, naming the call's biz and key where there is one.
        reason: String,
    },
    /// A call with the same key is still running (and `wait` was not set, or ran out).
    #[error("biz `{biz}` key `{key}` is still being processed by an earlier call")]
    InProgress {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// The key already succeeded and the mode is `Reject`.
    #[error("duplicate request: biz `{biz}` key `{key}` has already succeeded")]
    Duplicate {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// The key's record ended its replay and is kept as a tombstone
    /// ([`AfterExpiry::Gone`](crate::AfterExpiry::Gone)): the call it answers ran long
    /// ago, its answer is no longer kept, and it is not run again. HTTP answers 410.
    #[error("biz `{biz}` key `{key}` was used before and its answer has expired; it is not run again")]
    Expired {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// The key's record belonged to a data subject that was erased: the call ran
    /// before, what it stored is gone, and it is not run again. HTTP answers 410.
    #[error("biz `{biz}` key `{key}` was used before and its record was erased; it is not run again")]
    Erased {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// The key already succeeded, and its operation keeps only a digest of the answer
    /// ([`Idempotent::keep_answer(false)`](crate::Idempotent::keep_answer)): the call is
    /// not run again, and its answer cannot be given again.
    #[error(
        "biz `{biz}` key `{key}` has already succeeded; only a digest of its answer is kept, so it is not replayed"
    )]
    AnswerNotKept {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// The key was first used with another payload.
    #[error("biz `{biz}` key `{key}` was first used with a different payload")]
    PayloadMismatch {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
    },
    /// The first call with this key failed and `on_error = Record` kept that outcome.
    #[error("biz `{biz}` key `{key}` failed before and the failure is recorded: {message}")]
    PreviousFailed {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
        /// The recorded `error_message`.
        message: String,
    },
    /// This call no longer holds its claim: another call took it over after its lease
    /// lapsed, or an operator released it. Its write was refused by the fence and
    /// changed nothing. The body did run.
    #[error(
        "lease lost: biz `{biz}` key `{key}` is no longer held under fence {fence} (taken over after \
         its lease lapsed, or released by an operator); this call's {operation} changed nothing"
    )]
    LeaseLost {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
        /// The fence this call held.
        fence: u64,
        /// The refused write: `complete`, `fail` or `release`.
        operation: &'static str,
    },
    /// An effect of this call may have happened and nobody could tell: its holder died
    /// (or its request went unanswered) after the effect started, and the step's policy
    /// says to fail closed, or its lookup could not tell. The record stays unsettled —
    /// every duplicate gets this error, nothing runs the effect again — until an
    /// operator settles it (`idem settle`, [`repair::settle`](crate::repair::settle)).
    #[error(
        "the outcome of {} of biz `{biz}` key `{key}` is unknown (effect key `{effect_key}`): it may have \
         happened, so it is not run again; find out from the other side, then settle it \
         (`idem settle {biz} {key}{} --value JSON` or `--not-done`)",
        step.as_deref().map_or("the body".to_owned(), |step| format!("step `{step}`")),
        step.as_deref().map_or(String::new(), |step| format!(" {step}"))
    )]
    OutcomeUnknown {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
        /// The step whose outcome is unknown; `None` for the whole body.
        step: Option<String>,
        /// The key the effect was sent with ([`Context::effect_key`](crate::Context::effect_key)).
        effect_key: String,
        /// When the effect's intent was recorded.
        since: std::time::SystemTime,
    },
    /// The store could not be reached or answered with an error. If this happened on
    /// claim, the body did not run (fail closed).
    #[error("store failed to {operation} biz `{biz}` key `{key}`")]
    Store {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
        /// The store operation: `claim`, `renew`, `complete`, `fail`, `release`, `get`.
        operation: &'static str,
        /// The cause, as the backend reported it.
        #[source]
        source: StoreError,
    },
    /// The payload or the body's `Ok` value could not be serialized to JSON.
    #[error("could not encode the {what} of biz `{biz}` key `{key}`")]
    Encode {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
        /// `payload` or `response`.
        what: &'static str,
        /// Why: the serializer's own error, or why the value would not replay equal.
        #[source]
        source: std::sync::Arc<dyn StdError + Send + Sync + 'static>,
    },
    /// The stored record cannot be read back: its response no longer deserializes into
    /// the function's `Ok` type (the type changed between deploys, or the row was
    /// edited), or a sealed value of it does not open (moved from another record,
    /// tampered with, sealed with a key the ring lacks). Nothing is replayed, the body
    /// does not run, and the record is kept.
    #[error("could not decode the stored record of biz `{biz}` key `{key}`")]
    Decode {
        /// Business namespace.
        biz: String,
        /// Idempotency key.
        key: String,
        /// The deserializer's error, or why the sealed value did not open.
        #[source]
        source: Box<dyn StdError + Send + Sync + 'static>,
    },
    /// No `store =` was given and no default store was installed with [`install`](crate::install).
    #[error("no idempotency store for biz `{biz}`: call `idem::install(store)` at start-up or pass `store = ...`")]
    NoStore {
        /// Business namespace.
        biz: String,
    },
}

/// A backend's failure, independent of any backend crate.
///
/// Stores wrap their driver's error in it with [`StoreError::with_source`]; the
/// original stays reachable through [`std::error::Error::source`].
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    message: String,
    #[source]
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
    /// The record was read, and a value of it cannot be (a sealed value that does not
    /// open): the call fails with [`Error::Decode`], as for a response that does not
    /// deserialize.
    unreadable: bool,
}

impl StoreError {
    /// A failure described by `message` alone.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
            unreadable: false,
        }
    }

    /// A failure described by `message`, caused by `source`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self {
            message: message.into(),
            source: Some(source.into()),
            unreadable: false,
        }
    }

    /// The record `(biz, key)` was read and one of its values cannot be, for `source`
    /// (a sealed value that does not open): the call fails with [`Error::Decode`], and
    /// the record is left as it is.
    pub fn unreadable(biz: &str, key: &str, source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Self {
            message: format!("a value of the record of biz `{biz}` key `{key}` cannot be read"),
            source: Some(source.into()),
            unreadable: true,
        }
    }

    /// Whether the record was read and a value of it cannot be ([`unreadable`](Self::unreadable)).
    pub fn is_unreadable(&self) -> bool {
        self.unreadable
    }

    /// The message, without the source.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// This failure as a new value, for each of the callers a shared read failed for:
    /// the same message and kind, with this failure's source behind it.
    pub(crate) fn relayed(self: &std::sync::Arc<Self>) -> StoreError {
        StoreError {
            message: self.message.clone(),
            source: self
                .source
                .is_some()
                .then(|| Box::new(RelayedSource(std::sync::Arc::clone(self))) as Box<dyn StdError + Send + Sync>),
            unreadable: self.unreadable,
        }
    }
}

/// The source of a failure relayed to several callers: the original's source, shared.
#[derive(Debug)]
struct RelayedSource(std::sync::Arc<StoreError>);

impl std::fmt::Display for RelayedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0.source {
            Some(source) => source.fmt(f),
            None => Ok(()),
        }
    }
}

impl StdError for RelayedSource {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source.as_deref().and_then(StdError::source)
    }
}

/// `url` with its password replaced by `***` (`postgres://idem:***@db/x`), fit for an
/// error message: what a store names when it cannot connect.
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}")
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod redaction_tests {
    use super::redacted_url;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redacted_url("postgres://idem:secret@db:5432/x"),
            "postgres://idem:***@db:5432/x"
        );
        assert_eq!(
            redacted_url("redis://:secret@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
        assert_eq!(redacted_url("postgres://idem@db/x"), "postgres://idem@db/x");
        assert_eq!(redacted_url("sqlite://data/idem.db"), "sqlite://data/idem.db");
    }
}

/// An error and its causes, `: `-joined, as an error reporter prints them; a cause whose
/// text the message already holds (a driver's error that prints its source inside its
/// own message) is said once.
///
/// ```
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let error = idem_runtime::StoreError::with_source("the store is unreachable", refused);
/// assert_eq!(idem_runtime::error_chain(&error), "the store is unreachable: connection refused");
/// ```
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod chain_tests {
    use super::error_chain as chain;

    /// An error whose message may hold its source's text, as drivers' errors do.
    #[derive(Debug)]
    struct Wrapped(String, Option<std::io::Error>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_ref().map(|e| e as _)
        }
    }

    #[test]
    fn a_cause_is_said_once() {
        let refused = || std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let driver = Wrapped(
            format!("error communicating with database: {}", refused()),
            Some(refused()),
        );
        let text = chain(&driver);
        assert_eq!(text.matches(&refused().to_string()).count(), 1, "{text}");
        let plain = Wrapped("pool timed out".to_owned(), Some(refused()));
        assert_eq!(chain(&plain), format!("pool timed out: {}", refused()));
    }
}
