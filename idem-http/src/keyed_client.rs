//! Outgoing requests that keep their key through retries, and say when their outcome
//! is unknown.
//!
//! [`KeyedClient::send`] sets the running call's effect key as the request's
//! `Idempotency-Key` and sends it, retrying — always with the same key — what may
//! succeed on a second try: a connection that could not be made, a request that went
//! unanswered, a `5xx`, a `409` with `Retry-After` (the other side is still working on
//! that key). A `4xx` is the other side's answer and is returned as it is, never retried.
//! When the tries run out, [`SendError::is_ambiguous`] says whether the request may have
//! taken effect (it left, and no answer came back, or the answer was a `5xx`): give it
//! to [`Step::ambiguous_if`](idem_runtime::Step::ambiguous_if), so the step reconciles or
//! fails closed instead of taking the failure for "nothing happened".

use std::time::Duration;

use backon::Retryable;
use http::StatusCode;

use crate::outgoing::{outgoing_key, NoCall, IDEMPOTENCY_KEY};
use crate::tries::Tries;

/// The longest `Retry-After` waited for; a longer one is cut to this.
const LONGEST_RETRY_AFTER: Duration = Duration::from_secs(30);

/// A `reqwest` client that sends each request with the effect key of the running call
/// and retries it with that key.
///
/// ```no_run
/// use idem_http::KeyedClient;
/// # async fn charge() -> Result<(), Box<dyn std::error::Error>> {
/// let bank = KeyedClient::new(reqwest::Client::new());
/// // inside an #[idempotent] body or a handler behind the layer:
/// let response = bank
///     .send(reqwest::Client::new().post("http://bank.internal/charges").body("{}"), "charge")
///     .await?;
/// # let _ = response; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct KeyedClient {
    client: reqwest::Client,
    tries: Tries,
}

/// Why a keyed request did not come back with an answer to return.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No running idempotent call to take the key from; nothing was sent.
    #[error(transparent)]
    NoCall(#[from] NoCall),
    /// The request could not be built (a bad URL, a bad header); nothing was sent.
    #[error("the request could not be built: {0}")]
    Invalid(#[source] reqwest::Error),
    /// Every try failed before the request reached the other side (no connection):
    /// it did not take effect.
    #[error("the request never reached the service after {attempts} tries: {source}")]
    NotSent {
        /// How many tries were made.
        attempts: usize,
        /// The last try's error.
        #[source]
        source: reqwest::Error,
    },
    /// The request left and no answer came back (a timeout, a connection lost after
    /// sending): it may have taken effect.
    #[error("the request went unanswered after {attempts} tries (it may have taken effect): {source}")]
    Unanswered {
        /// How many tries were made.
        attempts: usize,
        /// The last try's error.
        #[source]
        source: reqwest::Error,
    },
    /// The other side answered every try with a `5xx`, or was still working on the key
    /// (`409` with `Retry-After`): it may have taken effect.
    #[error("the service answered {status} after {attempts} tries (it may have taken effect)")]
    Unsettled {
        /// How many tries were made.
        attempts: usize,
        /// The last answer's status.
        status: StatusCode,
    },
}

impl SendError {
    /// Whether the request may have taken effect: it left, and no answer that says
    /// otherwise came back. Hand it to
    /// [`Step::ambiguous_if`](idem_runtime::Step::ambiguous_if).
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, SendError::Unanswered { .. } | SendError::Unsettled { .. })
    }
}

/// One try's failure, before the tries run out.
enum Failure {
    Transport(reqwest::Error),
    Status {
        status: StatusCode,
        retry_after: Option<Duration>,
    },
}

impl KeyedClient {
    /// Over `client` (its timeouts are the tries' timeouts): 4 tries, pausing 100 ms and
    /// doubling up to 2 s between them (or as long as `Retry-After` says, up to 30 s).
    pub fn new(client: reqwest::Client) -> Self {
        Self {
            client,
            tries: Tries::default(),
        }
    }

    crate::tries::schedule_setters!();

    /// Send `request` with `Idempotency-Key` set to the running call's key for
    /// `effect`, retrying with the same key as the module says. A request whose body
    /// is a stream cannot be sent twice and is tried once.
    ///
    /// # Errors
    ///
    /// [`SendError`]: see [`SendError::is_ambiguous`] for which ones may have taken effect.
    pub async fn send(&self, request: reqwest::RequestBuilder, effect: &str) -> Result<reqwest::Response, SendError> {
        let request = request
            .header(IDEMPOTENCY_KEY, outgoing_key(effect)?)
            .build()
            .map_err(SendError::Invalid)?;
        let backoff = self.tries.backoff(request.try_clone().is_some());
        let tries = std::sync::atomic::AtomicUsize::new(0);
        let mut once = Some(request);
        let attempt = || {
            tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let request = match once.as_ref().and_then(reqwest::Request::try_clone) {
                Some(copy) => copy,
                None => once.take().expect("a request that cannot be copied is tried once"),
            };
            async move {
                let response = self.client.execute(request).await.map_err(Failure::Transport)?;
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok())
                    .map(|secs| Duration::from_secs(secs).min(LONGEST_RETRY_AFTER));
                let in_progress = status == StatusCode::CONFLICT && retry_after.is_some();
                if status.is_server_error() || in_progress {
                    return Err(Failure::Status { status, retry_after });
                }
                Ok(response)
            }
        };
        let answer = attempt
            .retry(backoff)
            .adjust(|failure: &Failure, pause| match failure {
                Failure::Status {
                    retry_after: Some(after),
                    ..
                } => pause.map(|_| *after),
                _ => pause,
            })
            .notify(|failure: &Failure, pause| {
                let what = match failure {
                    Failure::Transport(error) => error.to_string(),
                    Failure::Status { status, .. } => status.to_string(),
                };
                tracing::debug!(target: "idem", effect = %idem_runtime::observe::shown_key(effect), failure = %what, ?pause, "keyed request failed; sending it again with its key");
            })
            .await;
        let attempts = tries.load(std::sync::atomic::Ordering::Relaxed);
        answer.map_err(|failure| match failure {
            Failure::Transport(source) if source.is_connect() => SendError::NotSent { attempts, source },
            Failure::Transport(source) => SendError::Unanswered { attempts, source },
            Failure::Status { status, .. } => SendError::Unsettled { attempts, status },
        })
    }
}
