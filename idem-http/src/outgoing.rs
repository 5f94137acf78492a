//! The key travels on: an `Idempotency-Key` for a request to another service, derived
//! from the running call (the effect key of [`Context::effect_key`]), stable across
//! retries and takeovers of that call.
//!
//! [`Context::effect_key`]: idem_runtime::Context::effect_key

use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::{HeaderName, HeaderValue};

/// The header's name, lower-case as HTTP/2 sends it.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// There is no running idempotent call to derive a key from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoCall {
    effect: String,
}

impl std::fmt::Display for NoCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "an idempotency key for the effect `{}` needs a running idempotent call: derive it inside a handler \
             behind the layer or inside an #[idempotent] body",
            self.effect
        )
    }
}

impl std::error::Error for NoCall {}

/// The `Idempotency-Key` value for the effect `effect` of the running call: its effect
/// key as an sf-string, or `"sha256:<hex>"` of it when it is longer than 255 bytes or
/// holds characters an sf-string cannot carry.
pub fn outgoing_key(effect: &str) -> Result<HeaderValue, NoCall> {
    let context = idem_runtime::context().ok_or_else(|| NoCall {
        effect: effect.to_owned(),
    })?;
    let key = context.effect_key(effect);
    let key = idem_runtime::digest::key_or_digest(key, |c| (' '..='~').contains(&c));
    let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
    Ok(HeaderValue::try_from(quoted).expect("visible ASCII is a header value"))
}

/// Set the `Idempotency-Key` of an outgoing request to the effect key of the running
/// call: the downstream service sees the same key on every retry of this call.
///
/// ```
/// use idem_http::IdempotencyKeyExt;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// // inside a handler behind the layer, or an #[idempotent] body:
/// let request = http::Request::post("http://bank.internal/charges")
///     .idempotency_key("charge")?
///     .body(())?;
/// # Ok(()) }
/// ```
pub trait IdempotencyKeyExt: Sized {
    /// The request with `Idempotency-Key` set for `effect`; [`NoCall`] outside a call.
    fn idempotency_key(self, effect: &str) -> Result<Self, NoCall>;
}

impl IdempotencyKeyExt for http::request::Builder {
    fn idempotency_key(self, effect: &str) -> Result<Self, NoCall> {
        Ok(self.header(IDEMPOTENCY_KEY, outgoing_key(effect)?))
    }
}

impl<B> IdempotencyKeyExt for http::Request<B> {
    fn idempotency_key(mut self, effect: &str) -> Result<Self, NoCall> {
        self.headers_mut().insert(IDEMPOTENCY_KEY, outgoing_key(effect)?);
        Ok(self)
    }
}

#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl IdempotencyKeyExt for reqwest::RequestBuilder {
    fn idempotency_key(self, effect: &str) -> Result<Self, NoCall> {
        Ok(self.header(IDEMPOTENCY_KEY, outgoing_key(effect)?))
    }
}

/// A tower layer for a client (a tonic `Channel`, a hyper client): every request sent
/// through it inside an idempotent call carries the `Idempotency-Key` of the call's
/// effect `effect` — the same key on every retry and takeover of the call, so a server
/// behind [`IdempotencyLayer`](crate::IdempotencyLayer) (or any that honours the header)
/// answers a repeat with its first answer. Outside a call the request goes as it is.
///
/// ```
/// use idem_http::OutgoingKeyLayer;
/// use tower_layer::Layer;
/// # fn demo(channel: impl tower_service::Service<http::Request<()>>) {
/// let bank = OutgoingKeyLayer::new("charge").layer(channel);
/// # let _ = bank; }
/// ```
#[derive(Debug, Clone)]
pub struct OutgoingKeyLayer {
    effect: Arc<str>,
}

impl OutgoingKeyLayer {
    /// Keys for the effect `effect` of the running call.
    pub fn new(effect: &str) -> Self {
        Self { effect: effect.into() }
    }
}

impl<S> tower_layer::Layer<S> for OutgoingKeyLayer {
    type Service = OutgoingKey<S>;

    fn layer(&self, inner: S) -> OutgoingKey<S> {
        OutgoingKey {
            inner,
            effect: self.effect.clone(),
        }
    }
}

/// The client service of [`OutgoingKeyLayer`].
#[derive(Debug, Clone)]
pub struct OutgoingKey<S> {
    inner: S,
    effect: Arc<str>,
}

impl<S, B> tower_service::Service<http::Request<B>> for OutgoingKey<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The call's context is the caller's task's: read here, where the call is made.
        if let Ok(key) = outgoing_key(&self.effect) {
            request.headers_mut().insert(IDEMPOTENCY_KEY, key);
        }
        self.inner.call(request)
    }
}

/// Whether a gRPC call that ended with status `code` may have taken effect: it was
/// cut off (`DEADLINE_EXCEEDED`, `CANCELLED`, `UNAVAILABLE` once sent) or failed inside
/// the server (`UNKNOWN`, `INTERNAL`, `DATA_LOSS`, `ABORTED`). The statuses of a refusal
/// (`INVALID_ARGUMENT`, `NOT_FOUND`, `PERMISSION_DENIED`, `FAILED_PRECONDITION`, …) say
/// it did not. For [`Step::ambiguous_if`](idem_runtime::Step::ambiguous_if).
pub fn grpc_status_is_ambiguous(code: i32) -> bool {
    // CANCELLED 1, UNKNOWN 2, DEADLINE_EXCEEDED 4, ABORTED 10, INTERNAL 13,
    // UNAVAILABLE 14, DATA_LOSS 15.
    matches!(code, 1 | 2 | 4 | 10 | 13 | 14 | 15)
}
