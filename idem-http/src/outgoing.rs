//! The key travels on: an `Idempotency-Key` for a request to another service, derived
//! from the running call (the effect key of [`Context::effect_key`]), stable across
//! retries and takeovers of that call.
//!
//! [`Context::effect_key`]: idem_runtime::Context::effect_key

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
