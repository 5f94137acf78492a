//! A tonic client that keeps the call's key through retries, and says when an outcome
//! is unknown.
//!
//! [`GrpcRetryLayer`] goes over a tonic `Channel`. Inside an idempotent call, every
//! request through it carries the call's effect key as its `Idempotency-Key` (as
//! [`OutgoingKeyLayer`](crate::OutgoingKeyLayer) does), and a try that may succeed on a
//! second one is sent again **with the same key**: a connection that could not be made,
//! a request that went unanswered (`CANCELLED` by a client timeout, `DEADLINE_EXCEEDED`),
//! or a status from a server that may be working on it or failed inside (`ABORTED` — a
//! server behind [`IdempotencyLayer`](crate::IdempotencyLayer) still running that key —
//! `UNAVAILABLE`, `UNKNOWN`, `INTERNAL`). A refusal (`INVALID_ARGUMENT`,
//! `UNAUTHENTICATED`, `FAILED_PRECONDITION`, …) is the server's answer and is returned at
//! once. When the tries run out, the last status is returned; [`grpc_outcome_is_unknown`]
//! says whether the call may have taken effect — give it to
//! [`Step::ambiguous_if`](idem_runtime::Step::ambiguous_if).
//!
//! Outside an idempotent call a request has no key to keep and is sent once, as it is.
//! The request's messages are buffered to be sent again: put it under unary and
//! server-streaming methods (whose client sends one message), not under a client or
//! bidirectional stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use backon::Retryable;
use bytes::Bytes;
use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::{Code, Status};

use crate::outgoing::{grpc_status_is_ambiguous, outgoing_key, IDEMPOTENCY_KEY};
use crate::tries::Tries;

/// Retries with the running call's key, for a tonic client: see the
/// [module](crate::grpc_retry).
///
/// ```
/// use idem_http::GrpcRetryLayer;
/// use tower_layer::Layer;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = tonic::transport::Channel::from_static("http://bank.internal:50051").connect_lazy();
/// let bank = tonic::client::Grpc::new(GrpcRetryLayer::new("charge").layer(channel));
/// # let _ = bank; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct GrpcRetryLayer {
    effect: Arc<str>,
    tries: Tries,
}

impl GrpcRetryLayer {
    /// Keys for the effect `effect` of the running call; 4 tries, pausing 100 ms and
    /// doubling up to 2 s between them.
    pub fn new(effect: &str) -> Self {
        Self {
            effect: effect.into(),
            tries: Tries::default(),
        }
    }

    crate::tries::schedule_setters!();
}

impl<S> tower_layer::Layer<S> for GrpcRetryLayer {
    type Service = GrpcRetry<S>;

    fn layer(&self, inner: S) -> GrpcRetry<S> {
        GrpcRetry {
            inner,
            effect: self.effect.clone(),
            tries: self.tries,
        }
    }
}

/// The client service of [`GrpcRetryLayer`]; its error is the last try's status.
#[derive(Debug, Clone)]
pub struct GrpcRetry<S> {
    inner: S,
    effect: Arc<str>,
    tries: Tries,
}

/// Whether a call that ended with `status` may have taken effect: its code says so
/// ([`grpc_status_is_ambiguous`]) and the request was sent — a connection that was never
/// made (tonic's `ConnectError`) carried nothing.
pub fn grpc_outcome_is_unknown(status: &Status) -> bool {
    grpc_status_is_ambiguous(status.code() as i32) && !never_sent(status)
}

/// The status came from a connection that was never made.
fn never_sent(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Whether a try that ended with `code` is sent again: every status that may hide an
/// effect ([`grpc_status_is_ambiguous`]) may succeed on a second try with the same key,
/// except `DATA_LOSS`.
fn retried(code: Code) -> bool {
    grpc_status_is_ambiguous(code as i32) && code != Code::DataLoss
}

/// The status of a transport error (tonic's own mapping, its source kept).
fn status_of(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Status {
    Status::from_error(error.into())
}

/// Wait until `service` is ready.
async fn ready<S, R>(service: &mut S) -> Result<(), S::Error>
where
    S: tower_service::Service<R>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx)).await
}

/// A copy of the request for one try: its head, and its buffered messages.
fn copy(parts: &http::request::Parts, messages: &Bytes) -> http::Request<Body> {
    let mut request = http::Request::new(Body::new(http_body_util::Full::new(messages.clone())));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    request
}

impl<S, B> tower_service::Service<http::Request<Body>> for GrpcRetry<S>
where
    S: tower_service::Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<B>, Status>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx).map_err(status_of)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The call's context is the caller's task's: read here, where the call is made.
        let key = outgoing_key(&self.effect).ok();
        // Without a key a second try could run the call twice: it is tried once.
        let backoff = self.tries.backoff(key.is_some());
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let effect = self.effect.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            if let Some(key) = key {
                parts.headers.insert(IDEMPOTENCY_KEY, key);
            }
            let messages = body.collect().await?.to_bytes();
            let attempt = move || {
                // Each try on a clone of the channel, made ready first.
                let mut service = inner.clone();
                let request = copy(&parts, &messages);
                async move {
                    ready(&mut service).await.map_err(status_of)?;
                    let response = service.call(request).await.map_err(status_of)?;
                    // A status in the head is a trailers-only answer: the call ended there.
                    match Status::from_header_map(response.headers()) {
                        Some(status) if retried(status.code()) => Err(status),
                        _ => Ok(response),
                    }
                }
            };
            attempt
                .retry(backoff)
                .when(|status: &Status| retried(status.code()))
                .notify(|status: &Status, pause| {
                    tracing::debug!(target: "idem", effect = %idem_runtime::observe::shown_key(&effect), code = ?status.code(), ?pause, "keyed gRPC call failed; sending it again with its key");
                })
                .await
        })
    }
}
