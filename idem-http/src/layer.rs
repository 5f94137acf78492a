//! The layer and its options.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::request::Parts;
use http::Method;
use idem_runtime::{Idempotent, Mode, OnError};
use tower_layer::Layer;

use crate::body_print::BodyFingerprint;
use crate::caller::Callers;
use crate::outgoing::IDEMPOTENCY_KEY;
use crate::service::IdempotencyService;
use crate::settings::Settings;

/// How much of a request body the layer buffers by default: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// The largest response the layer records by default: 1 MiB. A larger one, or a
/// streamed one that grows past it, goes to the client as it comes and is not kept.
pub const DEFAULT_RESPONSE_LIMIT: usize = 1 << 20;

/// Which 4xx responses are recorded and replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClientErrors {
    /// Those answered after the handler said it [`started`](crate::started) (a declined
    /// card); a 4xx before that (an extractor's rejection, a failed validation) leaves
    /// no record, so a corrected retry with the same key runs.
    #[default]
    WhenStarted,
    /// Every 4xx, as Stripe does once an endpoint began executing.
    Always,
}

/// `tower::Layer` that makes the requests it wraps idempotent by their
/// `Idempotency-Key` header, on any idem store, with the records, leases, fences and
/// `wait` of [`Idempotent`].
///
/// [`IdempotencyLayer::new`] makes an [`IdempotencyLayer<CallerUnnamed>`]: it becomes a
/// `tower::Layer` only once it is told whose each request is — the authenticated
/// principal ([`principal`](Self::principal), [`caller`](Self::caller)), one session
/// cookie ([`session_cookie`](Self::session_cookie)), or nobody's
/// ([`shared`](Self::shared)). There is no default: a caller told by the bytes of its
/// credentials would become another caller when a cookie or a token changes between a
/// click and its retry, and be charged twice.
///
/// Defaults: header `Idempotency-Key`, required on `POST` and `PATCH` (every other
/// method passes through untouched); a request whose caller cannot be named refused
/// with 401; JSON bodies fingerprinted as data ([`BodyFingerprint::CanonicalJson`]);
/// request bodies up to [`DEFAULT_BODY_LIMIT`]; responses recorded up to
/// [`DEFAULT_RESPONSE_LIMIT`] and streamed responses passed on as they come; 4xx
/// recorded when [`ClientErrors::WhenStarted`], 5xx not recorded (the claim is
/// released so a retry runs), `Retry-After: 1` on a 409.
///
/// The operation's `biz`, `ttl`, `lease`, `wait` and store are used as given; its mode
/// is always [`Mode::ReturnFirst`] and its `on_error` [`OnError::Release`]: a
/// duplicate gets the first response, and what is not recorded is released.
#[derive(Clone)]
pub struct IdempotencyLayer<C = CallerNamed> {
    settings: Arc<Settings>,
    caller: PhantomData<C>,
}

/// The state of an [`IdempotencyLayer`] not yet told whose each request is: not a
/// `tower::Layer` until [`principal`](IdempotencyLayer::principal),
/// [`caller`](IdempotencyLayer::caller), [`session_cookie`](IdempotencyLayer::session_cookie)
/// or [`shared`](IdempotencyLayer::shared) is called.
#[derive(Debug, Clone, Copy)]
pub struct CallerUnnamed;

/// The state of an [`IdempotencyLayer`] that knows whose each request is: a `tower::Layer`.
#[derive(Debug, Clone, Copy)]
pub struct CallerNamed;

/// Implemented by [`CallerNamed`] alone: what makes an [`IdempotencyLayer`] a `tower::Layer`.
#[diagnostic::on_unimplemented(
    message = "this IdempotencyLayer does not know whose each request is",
    label = "the layer's callers are not named",
    note = "name them before using the layer: `.principal::<User>(|user| user.id.to_string())` (what your auth \
            middleware put in the request's extensions), `.caller(|request| …)`, `.session_cookie(\"session\")`, or \
            `.shared()` for a route whose records every caller may share"
)]
pub trait NamesItsCallers: sealed::Sealed {}

impl NamesItsCallers for CallerNamed {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::CallerNamed {}
    impl Sealed for super::CallerUnnamed {}
}

impl IdempotencyLayer<CallerUnnamed> {
    /// A layer running every request it makes idempotent as a call of `op`, once it is
    /// told whose each request is.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use idem_http::IdempotencyLayer;
    /// use idem_runtime::{Idempotent, MemoryStore};
    ///
    /// /// What the application's auth middleware puts in a request's extensions once it
    /// /// has verified its session or token.
    /// #[derive(Clone)]
    /// struct User { id: u64 }
    ///
    /// let layer = IdempotencyLayer::new(
    ///     Idempotent::new("http.payments")
    ///         .store(Arc::new(MemoryStore::new()))
    ///         .ttl(Duration::from_secs(24 * 3600)),
    /// )
    /// // The caller is the signed-in user, whatever its cookies or token look like on
    /// // each retry; a request without one is refused (401).
    /// .principal(|user: &User| user.id.to_string())
    /// .replay_header(http::header::LOCATION);
    /// ```
    ///
    /// Until then it is no `tower::Layer`, and using it does not compile:
    ///
    /// ```compile_fail
    /// use std::sync::Arc;
    /// use idem_http::IdempotencyLayer;
    /// use idem_runtime::{Idempotent, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(Idempotent::new("http.payments").store(Arc::new(MemoryStore::new())));
    /// let service = tower_layer::Layer::layer(&layer, tower_service_fn());
    /// # fn tower_service_fn() {}
    /// ```
    pub fn new(op: Idempotent) -> Self {
        IdempotencyLayer {
            settings: Arc::new(Settings {
                op: op.mode(Mode::ReturnFirst).on_error(OnError::Release),
                header: IDEMPOTENCY_KEY,
                methods: vec![Method::POST, Method::PATCH],
                required: true,
                callers: Callers::Unnamed,
                tenant_header: None,
                body_fingerprint: BodyFingerprint::default(),
                ignored_fields: Vec::new(),
                response_limit: DEFAULT_RESPONSE_LIMIT,
                replayable: Vec::new(),
                record_server_errors: false,
                client_errors: ClientErrors::default(),
                body_limit: DEFAULT_BODY_LIMIT,
                retry_after: Duration::from_secs(1),
                subject: None,
            }),
            caller: PhantomData,
        }
    }
}

impl<C> IdempotencyLayer<C> {
    fn with(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    fn named(self, callers: Callers) -> IdempotencyLayer<CallerNamed> {
        let mut settings = self.settings;
        Arc::make_mut(&mut settings).callers = callers;
        IdempotencyLayer {
            settings,
            caller: PhantomData,
        }
    }

    /// Keep callers apart by the principal `T` that the application's authentication
    /// put in the request's extensions (an axum middleware's `request.extensions_mut()
    /// .insert(user)`, a tonic interceptor's): `name` says who it is (a user id, a
    /// token's subject). A request without a `T`, or whose name is empty, is refused
    /// with 401. The way to scope: a session cookie that rolls, a CSRF or analytics
    /// cookie that changes, a bearer token refreshed between an attempt and its retry
    /// leave the caller the same.
    pub fn principal<T, F>(self, name: F) -> IdempotencyLayer<CallerNamed>
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> String + Send + Sync + 'static,
    {
        self.named(Callers::Principal(Arc::new(move |request: &Parts| {
            request.extensions.get::<T>().map(&name)
        })))
    }

    /// Keep callers apart by what `caller` names from the request (an account a gateway
    /// authenticated and forwards, a verified session's user id). A request for which
    /// it answers `None` or an empty name is refused with 401, never treated as
    /// anonymous: name only callers the application has verified, and read a header's
    /// bytes (`String::from_utf8(value.as_bytes().to_vec()).ok()`), not `to_str()`,
    /// which fails on non-ASCII names.
    pub fn caller(
        self,
        caller: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> IdempotencyLayer<CallerNamed> {
        self.named(Callers::Principal(Arc::new(caller)))
    }

    /// Keep callers apart by the value of the cookie `name` alone (hashed, never stored
    /// in clear); other cookies may change between retries. A request without it is
    /// refused with 401.
    ///
    /// Only for a session cookie that keeps its value for the session: one that is
    /// rotated (a rolling session id, re-issued at each request or on sign-in) makes a
    /// retry sent after the rotation another caller, and runs the handler again. Where
    /// the application can tell the signed-in user, [`principal`](Self::principal)
    /// does not have this caveat.
    pub fn session_cookie(self, name: impl Into<String>) -> IdempotencyLayer<CallerNamed> {
        self.named(Callers::SessionCookie(name.into()))
    }

    /// Every caller of these routes shares one record per key: the same key and body
    /// from two callers get one response. Only for routes whose response is the same
    /// for everybody (a public action keyed by its own id).
    pub fn shared(self) -> IdempotencyLayer<CallerNamed> {
        self.named(Callers::Shared)
    }

    /// Narrow each caller's scope by the header `name` (an account or tenant a caller
    /// acts for, any bytes): the same caller's key under two tenants is two requests.
    /// The header never names a caller by itself: a request the layer cannot attribute
    /// to a caller is still refused, whatever tenant it names.
    pub fn tenant_header(self, name: HeaderName) -> Self {
        self.with(|s| s.tenant_header = Some(name))
    }

    /// Name each request's data subject (the signed-in user, an account), so that
    /// `idem::subject::erase` can remove what its records keep
    /// ([`Idempotent::subject`](idem_runtime::Idempotent::subject): only a keyed hash is
    /// stored). A retry of an erased request is answered 410
    /// `urn:idem:problem:record-erased` and never runs the handler. `None`: the
    /// request names no subject.
    pub fn subject(self, subject: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.with(|s| s.subject = Some(crate::settings::SubjectOf(Arc::new(subject))))
    }

    /// Read the key from `header` instead of `Idempotency-Key` (e.g. `X-Request-Id`).
    pub fn header(self, header: HeaderName) -> Self {
        self.with(|s| s.header = header)
    }

    /// The methods whose requests are made idempotent; every other passes through.
    /// Default `POST` and `PATCH` (`GET`, `HEAD`, `OPTIONS`, `PUT` and `DELETE` are
    /// idempotent by definition).
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.with(|s| s.methods = methods.into_iter().collect())
    }

    /// Let a request without the header through, untouched, instead of a 400.
    pub fn optional(self) -> Self {
        self.with(|s| s.required = false)
    }

    /// How request bodies are fingerprinted (default [`BodyFingerprint::CanonicalJson`]).
    pub fn body_fingerprint(self, how: BodyFingerprint) -> Self {
        self.with(|s| s.body_fingerprint = how)
    }

    /// Leave the JSON field at `pointer` (a JSON Pointer: `/sent_at`, `/meta/trace_id`)
    /// and everything under it out of the fingerprint: a retry may change it.
    pub fn ignore_field(self, pointer: impl Into<String>) -> Self {
        let pointer = pointer.into();
        self.with(|s| s.ignored_fields.push(pointer))
    }

    /// The largest response recorded whole (default [`DEFAULT_RESPONSE_LIMIT`]). A
    /// response without a known length (a stream) or a larger one is passed on as it
    /// comes, kept up to this size, and recorded only if it ended within it; otherwise
    /// the record says it ran and duplicates get 409 ([`Problem::NotReplayable`]).
    ///
    /// So does a streamed response the client stopped reading before its end (it
    /// disconnected, or its connection broke): the handler ran and its effects stand,
    /// the part it missed cannot be given again, and every retry with the same key gets
    /// that 409 — not a new run — until the operation's `ttl` ends the record. A client
    /// must not retry such a 409 in a loop: it asks for the outcome another way (a
    /// `GET` of the resource the request made, a statement by id) or, to run the
    /// request again on purpose, sends a new key. Keep streamed routes' effects
    /// retrievable by id for this reason, or give them a short `ttl`.
    ///
    /// [`Problem::NotReplayable`]: crate::Problem::NotReplayable
    pub fn response_limit(self, bytes: usize) -> Self {
        self.with(|s| s.response_limit = bytes)
    }

    /// Record `header` with the response and give it back on replays (`content-type`
    /// always is; others, such as `set-cookie`, are not unless named here).
    pub fn replay_header(self, header: HeaderName) -> Self {
        self.with(|s| s.replayable.push(header))
    }

    /// Record 5xx responses too (by default they are not: the claim is released and a
    /// retry runs the handler again).
    pub fn record_server_errors(self, record: bool) -> Self {
        self.with(|s| s.record_server_errors = record)
    }

    /// Which 4xx responses are recorded.
    pub fn client_errors(self, client_errors: ClientErrors) -> Self {
        self.with(|s| s.client_errors = client_errors)
    }

    /// The largest request body buffered (to fingerprint it and hand it on); a larger
    /// one gets 413 without being read further.
    pub fn body_limit(self, bytes: usize) -> Self {
        self.with(|s| s.body_limit = bytes)
    }

    /// The `Retry-After` of a 409 (rounded up to whole seconds).
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|s| s.retry_after = after)
    }
}

impl<C> std::fmt::Debug for IdempotencyLayer<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("settings", &*self.settings)
            .finish()
    }
}

impl<S, C: NamesItsCallers> Layer<S> for IdempotencyLayer<C> {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.settings.clone())
    }
}
