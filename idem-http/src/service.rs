//! One request through the layer: the key, the body, the call — claim, run the handler,
//! record its response, or replay the first one.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_runtime::Error;
use tower_service::Service;

use crate::key;
use crate::layer::Settings;
use crate::problem::Problem;
use crate::recorded::RecordedResponse;
use crate::scope::Scope;
use crate::started::StartedMark;

/// Errors of bodies, as tower passes them around.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The future of one request through the layer.
pub type ResponseFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

/// The service [`IdempotencyLayer`](crate::IdempotencyLayer) wraps around `S`.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    settings: Arc<Settings>,
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, settings: Arc<Settings>) -> Self {
        IdempotencyService { inner, settings }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .field("biz", &self.settings.op.biz())
            .finish()
    }
}

impl<S, B, RB> Service<Request<B>> for IdempotencyService<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body + From<Bytes> + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<RB>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service driven to readiness serves this request; its clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(self.settings.clone(), inner, request))
    }
}

/// Why a response is not recorded: the call releases its claim and answers it anyway.
enum Unrecorded<E> {
    /// idem refused or failed the call.
    Idem(Error),
    /// A response the settings do not record (a 5xx, a rejection before the handler).
    Response(Response<Bytes>),
    /// The inner service failed.
    Service(E),
    /// The response body could not be read.
    Body(BoxError),
}

impl<E> From<Error> for Unrecorded<E> {
    fn from(error: Error) -> Self {
        Unrecorded::Idem(error)
    }
}

async fn serve<S, B, RB>(settings: Arc<Settings>, mut inner: S, request: Request<B>) -> Result<Response<RB>, S::Error>
where
    S: Service<Request<B>, Response = Response<RB>>,
    B: Body + From<Bytes>,
    B::Error: Into<BoxError>,
    RB: Body + From<Bytes>,
    RB::Error: Into<BoxError>,
{
    if !settings.methods.contains(request.method()) {
        return inner.call(request).await;
    }
    let header = settings.header.as_str();
    let key = match key::parse(request.headers().get_all(&settings.header)) {
        Ok(Some(key)) => key,
        Ok(None) if !settings.required => return inner.call(request).await,
        Ok(None) => {
            let detail = format!(
                "{} {} needs an `{header}` header",
                request.method(),
                request.uri().path()
            );
            return Ok(settings.problem(Problem::KeyMissing, detail));
        }
        Err(problem) => return Ok(settings.problem(Problem::KeyMalformed, problem.detail(header))),
    };
    let (parts, body) = request.into_parts();
    let body = match read_body(body, &parts, settings.body_limit).await {
        Ok(body) => body,
        Err((problem, detail)) => return Ok(settings.problem(problem, detail)),
    };
    let tenant = settings
        .tenant
        .as_ref()
        .and_then(|tenant| tenant(&parts))
        .unwrap_or_default();
    let target = parts.uri.path_and_query().map_or("/", |target| target.as_str());
    let scope = Scope::new(parts.method.as_str(), &route_of(&parts), target, tenant, key, &body);
    let op = settings.op.clone().payload(&scope);
    let request = Request::from_parts(parts, B::from(body));

    let started = StartedMark::default();
    // The handler's own response, when it ran in this call and was recorded.
    let mut first: Option<Response<Bytes>> = None;
    let ran = &mut first;
    let outcome = op
        .execute(scope.record_key(), async {
            let response = started.scope(inner.call(request)).await.map_err(Unrecorded::Service)?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await.map_err(|e| Unrecorded::Body(e.into()))?.to_bytes();
            let recorded = settings
                .records(parts.status, started.is_set())
                .then(|| RecordedResponse::new(&parts, &body, &settings.replayable));
            let response = Response::from_parts(parts, body);
            match recorded {
                Some(recorded) => {
                    *ran = Some(response);
                    Ok(recorded)
                }
                None => Err(Unrecorded::Response(response)),
            }
        })
        .await;
    Ok(match outcome {
        Ok(recorded) => match first {
            Some(response) => response.map(RB::from),
            None => recorded.replay(),
        },
        Err(Unrecorded::Response(response)) => response.map(RB::from),
        Err(Unrecorded::Service(error)) => return Err(error),
        Err(Unrecorded::Body(error)) => {
            tracing::error!(%error, biz = settings.op.biz(), "the handler's response body failed; nothing recorded");
            settings.problem(
                Problem::NotRecorded,
                format!("the response body could not be read: {error}"),
            )
        }
        Err(Unrecorded::Idem(error)) => settings.answer(error, first.is_some()),
    })
}

impl Settings {
    pub(crate) fn problem<B: From<Bytes>>(&self, problem: Problem, detail: String) -> Response<B> {
        let secs = self.retry_after.as_secs() + u64::from(self.retry_after.subsec_nanos() > 0);
        problem.response(detail, secs)
    }

    /// The answer to a call idem refused or failed; `ran` when the handler ran in it.
    fn answer<B: From<Bytes>>(&self, error: Error, ran: bool) -> Response<B> {
        let problem = match &error {
            Error::InProgress { .. } => Problem::InProgress,
            Error::PayloadMismatch { .. } => Problem::KeyReused,
            Error::InvalidKey { .. } => Problem::KeyMalformed,
            _ if ran => Problem::NotRecorded,
            Error::Store { .. } => Problem::StoreUnavailable,
            _ => Problem::Misconfigured,
        };
        if problem.status().is_server_error() {
            tracing::error!(error = %error, "idempotency layer: {}", problem.title());
        }
        self.problem(problem, error.to_string())
    }
}

/// The request body, whole, if it is within `limit`.
async fn read_body<B>(body: B, parts: &Parts, limit: usize) -> Result<Bytes, (Problem, String)>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let too_large = |size: String| {
        (
            Problem::BodyTooLarge,
            format!("the request body is {size}; the limit is {limit} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if let Some(length) = declared.filter(|&length| length > limit as u64) {
        return Err(too_large(format!("{length} bytes")));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(too_large("larger".to_owned())),
        Err(error) => Err((Problem::BodyUnreadable, error.to_string())),
    }
}

/// The route the key is scoped by: axum's matched route (`/payments/{id}`) when the
/// layer sits on a route, else the request's path.
fn route_of(parts: &Parts) -> String {
    #[cfg(feature = "axum")]
    if let Some(matched) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return matched.as_str().to_owned();
    }
    parts.uri.path().to_owned()
}
