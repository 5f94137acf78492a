//! One request through the layer: the key, the body, the call — claim, run the handler,
//! record its response, or replay the first one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_runtime::Error;
use tokio::sync::oneshot;
use tower_service::Service;

use crate::body::{BoxError, IdempotencyBody, Kept};
use crate::body_print::BodyPrint;
use crate::grpc;
use crate::key;
use crate::problem::Problem;
use crate::recorded::RecordedResponse;
use crate::scope::Scope;
use crate::settings::Settings;
use crate::started::StartedMark;

/// The future of one request through the layer: the response, or the inner service's
/// error.
pub struct ResponseFuture<R, E> {
    inner: Pin<Box<dyn Future<Output = Result<R, E>> + Send>>,
}

impl<R, E> Future for ResponseFuture<R, E> {
    type Output = Result<R, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R, E> std::fmt::Debug for ResponseFuture<R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

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
    S: Service<Request<IdempotencyBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    type Response = Response<IdempotencyBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<IdempotencyBody<RB>>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service driven to readiness serves this request; its clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            inner: Box::pin(serve(self.settings.clone(), inner, request)),
        }
    }
}

/// Why a response is not recorded: the call releases its claim and answers it anyway.
enum Unrecorded<R, E> {
    /// idem refused or failed the call.
    Idem(Error),
    /// A response the settings do not record (a 5xx, a rejection before the handler).
    Response(R),
    /// The inner service failed.
    Service(E),
    /// The response body could not be read.
    Body(BoxError),
    /// A streamed response the settings do not record, already sent on.
    Sent,
}

impl<R, E> From<Error> for Unrecorded<R, E> {
    fn from(error: Error) -> Self {
        Unrecorded::Idem(error)
    }
}

/// The response the handler gave this caller, when it ran in this call.
type Slot<RB> = Arc<Mutex<Option<Response<IdempotencyBody<RB>>>>>;

/// What the layer makes of a request before any call: pass it on (a method or a
/// missing key it does not handle), refuse it, or call with its scope.
// Made once per request and matched at once: boxing a variant would only add an
// allocation.
#[allow(clippy::large_enum_variant)]
enum Admit<B> {
    Pass(Request<B>),
    Refuse(Problem, String),
    /// The request's scope, the request, and its data subject when the layer names one.
    Call(Scope, Request<IdempotencyBody<B>>, Option<String>),
}

/// One request through the layer: admitted, called, answered.
async fn serve<S, B, RB>(
    settings: Arc<Settings>,
    mut inner: S,
    request: Request<B>,
) -> Result<Response<IdempotencyBody<RB>>, S::Error>
where
    S: Service<Request<IdempotencyBody<B>>, Response = Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    let grpc = grpc::is_grpc(request.headers());
    let (scope, request, subject) = match admit(&settings, request).await {
        Admit::Call(scope, request, subject) => (scope, request, subject),
        Admit::Pass(request) => {
            let response = inner.call(request.map(IdempotencyBody::passed)).await?;
            return Ok(response.map(IdempotencyBody::passed));
        }
        Admit::Refuse(problem, detail) => return Ok(settings.refuse(grpc, problem, detail)),
    };
    // The call around the handler. A streamed response goes to the client at once; its
    // record is written when it ends, and its end reaches the client once the record
    // is written (or given up).
    let op = settings.op.clone().payload(&scope);
    let op = match subject {
        Some(subject) => op.subject(subject),
        None => op,
    };
    let first: Slot<RB> = Arc::default();
    let (streamed_tx, mut streamed_rx) = oneshot::channel();
    let (written_tx, written_rx) = oneshot::channel::<()>();
    // Boxed once here: the call's future then holds a pointer to the handler's future
    // (a few kilobytes with the inner service's) instead of carrying it by value.
    let handler = Box::pin(handle(
        settings.clone(),
        grpc,
        inner,
        request,
        first.clone(),
        (streamed_tx, written_rx),
    ));
    let record_key = scope.record_key();
    let mut call = Box::pin(async move { op.execute(record_key, handler).await });
    let outcome = tokio::select! {
        outcome = &mut call => outcome,
        Ok(streaming) = &mut streamed_rx => {
            let biz = settings.op.biz().to_owned();
            tokio::spawn(async move {
                if let Err(Unrecorded::Idem(error)) = call.await {
                    tracing::warn!(target: "idem", %error, %biz, "a streamed response's record could not be written");
                }
                drop(written_tx);
            });
            return Ok(streaming);
        }
    };
    let ran = first.lock().expect("the slot is not poisoned").take();
    respond(&settings, grpc, &scope, ran, outcome).await
}

/// The request's key, caller and body, read and checked: its scope, or why it is
/// passed on or refused.
async fn admit<B>(settings: &Settings, request: Request<B>) -> Admit<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    if !settings.methods.contains(request.method()) {
        return Admit::Pass(request);
    }
    let header = settings.header.as_str();
    let key = match key::parse(request.headers().get_all(&settings.header)) {
        Ok(Some(key)) => key,
        Ok(None) if !settings.required => return Admit::Pass(request),
        Ok(None) => {
            let detail = format!(
                "{} {} needs an `{header}` header",
                request.method(),
                request.uri().path()
            );
            return Admit::Refuse(Problem::KeyMissing, detail);
        }
        Err(problem) => return Admit::Refuse(Problem::KeyMalformed, problem.detail(header)),
    };
    let (parts, body) = request.into_parts();
    let tenant = match settings.callers.of(&parts, settings.tenant_header.as_ref()) {
        Ok(tenant) => tenant,
        Err(unknown) => return Admit::Refuse(Problem::CallerUnknown, unknown.detail()),
    };
    let body = match read_body(body, &parts, settings.body_limit).await {
        Ok(body) => body,
        Err((problem, detail)) => return Admit::Refuse(problem, detail),
    };
    let content_type = parts.headers.get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
    let print = BodyPrint::of(&body, content_type, settings.body_fingerprint, &settings.ignored_fields);
    let target = parts.uri.path_and_query().map_or("/", |target| target.as_str());
    let scope = Scope::new(parts.method.as_str(), &route_of(&parts), target, tenant, key, print);
    let subject = settings.subject.as_ref().and_then(|subject| (subject.0)(&parts));
    Admit::Call(scope, Request::from_parts(parts, IdempotencyBody::full(body)), subject)
}

/// The answer to a call that ended: the handler's response when it ran here, the
/// recorded one replayed, or the layer's problem.
async fn respond<RB, E>(
    settings: &Settings,
    grpc: bool,
    scope: &Scope,
    ran: Option<Response<IdempotencyBody<RB>>>,
    outcome: Result<RecordedResponse, Unrecorded<Response<IdempotencyBody<RB>>, E>>,
) -> Result<Response<IdempotencyBody<RB>>, E>
where
    RB: Body,
{
    Ok(match outcome {
        Ok(recorded) => match ran {
            Some(response) => response,
            None => recorded.replay(grpc),
        },
        Err(Unrecorded::Response(response)) => response,
        Err(Unrecorded::Service(error)) => return Err(error),
        Err(Unrecorded::Body(error)) => {
            tracing::error!(target: "idem", %error, biz = settings.op.biz(), "the handler's response body failed; nothing recorded");
            settings.refuse(
                grpc,
                Problem::NotRecorded,
                "the response body could not be read".to_owned(),
            )
        }
        // Only a streamed response is sent before its call ends, and that call ends in
        // a task of its own.
        Err(Unrecorded::Sent) => settings.refuse(
            grpc,
            Problem::NotRecorded,
            Problem::NotRecorded.default_detail().to_owned(),
        ),
        Err(Unrecorded::Idem(error)) => settings.answer(error, grpc, ran.is_some(), scope).await,
    })
}

/// The handler's run inside the call: its response recorded whole (a 2xx, a 4xx after
/// [`started`](crate::started)), passed on unrecorded, or — without a known length, or
/// larger than the limit — handed out on `streamed` at once and recorded when it ends,
/// its end held back until `written` ends.
async fn handle<S, B, RB>(
    settings: Arc<Settings>,
    grpc: bool,
    mut inner: S,
    request: Request<IdempotencyBody<B>>,
    first: Slot<RB>,
    (streamed, written): (oneshot::Sender<Response<IdempotencyBody<RB>>>, oneshot::Receiver<()>),
) -> Result<RecordedResponse, Unrecorded<Response<IdempotencyBody<RB>>, S::Error>>
where
    S: Service<Request<IdempotencyBody<B>>, Response = Response<RB>>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let started = StartedMark::default();
    let response = started.scope(inner.call(request)).await.map_err(Unrecorded::Service)?;
    let (parts, body) = response.into_parts();
    // A gRPC call is judged by its `grpc-status`: in the headers of a trailers-only
    // response, else in the trailers, at the end.
    let status_now = grpc.then(|| grpc::status_in(&parts.headers)).flatten();
    let records_now = match (grpc, status_now) {
        (false, _) => settings.records(parts.status, started.is_set()),
        (true, Some(status)) => settings.records_grpc(status, started.is_set()),
        (true, None) => true,
    };
    if !records_now {
        return Err(Unrecorded::Response(Response::from_parts(
            parts,
            IdempotencyBody::passed(body),
        )));
    }
    let judged_at_end = grpc && status_now.is_none();
    let records_ending = |trailers: Option<&http::HeaderMap>| {
        !judged_at_end || {
            let status = trailers.and_then(grpc::status_in).unwrap_or(2); // UNKNOWN
            settings.records_grpc(status, started.is_set())
        }
    };
    let limit = settings.response_limit;
    let head = RecordedResponse::new(&parts, &Bytes::new(), &settings.replayable);
    match body.size_hint().exact() {
        Some(length) if length <= limit as u64 => {
            let collected = body.collect().await.map_err(|e| Unrecorded::Body(e.into()))?;
            let trailers = collected.trailers().cloned();
            let body = collected.to_bytes();
            let recorded = records_ending(trailers.as_ref()).then(|| head.with_body(&body, trailers.as_ref()));
            let response = Response::from_parts(parts, IdempotencyBody::full_with_trailers(body, trailers));
            match recorded {
                Some(recorded) => {
                    *first.lock().expect("the slot is not poisoned") = Some(response);
                    Ok(recorded)
                }
                None => Err(Unrecorded::Response(response)),
            }
        }
        _ => {
            let (body, kept) = IdempotencyBody::teed(body, limit, written);
            // The caller is gone if this fails; the copy then ends at once, not kept.
            let _ = streamed.send(Response::from_parts(parts, body));
            match kept.await {
                Ok(Kept::Whole(body, trailers)) if records_ending(trailers.as_ref()) => {
                    Ok(head.with_body(&body, trailers.as_ref()))
                }
                Ok(Kept::Whole(..)) => Err(Unrecorded::Sent),
                Ok(Kept::NotKept(why)) => Ok(head.not_kept(why)),
                Err(_) => Ok(head.not_kept("the client stopped reading it")),
            }
        }
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
