//! The layer and its options.

use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderName;
use http::request::Parts;
use http::Method;
use idem_runtime::{Idempotent, Mode, OnError};
use tower_layer::Layer;

use crate::outgoing::IDEMPOTENCY_KEY;
use crate::service::IdempotencyService;

/// How much of a request body the layer buffers by default: 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

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

/// The application's tenant of a request: the same key from two tenants is two requests.
type Tenant = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// `tower::Layer` that makes the requests it wraps idempotent by their
/// `Idempotency-Key` header, on any idem store, with the records, leases, fences and
/// `wait` of [`Idempotent`].
///
/// Defaults: header `Idempotency-Key`, required on `POST` and `PATCH` (every other
/// method passes through untouched), no tenant, bodies up to [`DEFAULT_BODY_LIMIT`],
/// 4xx recorded when [`ClientErrors::WhenStarted`], 5xx not recorded (the claim is
/// released so a retry runs), `Retry-After: 1` on a 409.
///
/// The operation's `biz`, `ttl`, `lease`, `wait` and store are used as given; its mode
/// is always [`Mode::ReturnFirst`] and its `on_error` [`OnError::Release`]: a
/// duplicate gets the first response, and what is not recorded is released.
#[derive(Clone)]
pub struct IdempotencyLayer {
    settings: Arc<Settings>,
}

/// The options, shared by every service the layer makes.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) op: Idempotent,
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) required: bool,
    pub(crate) tenant: Option<Tenant>,
    pub(crate) replayable: Vec<HeaderName>,
    pub(crate) record_server_errors: bool,
    pub(crate) client_errors: ClientErrors,
    pub(crate) body_limit: usize,
    pub(crate) retry_after: Duration,
}

impl Settings {
    /// Whether a response with `status` is recorded; `started` when the handler said so.
    pub(crate) fn records(&self, status: http::StatusCode, started: bool) -> bool {
        if status.is_server_error() {
            self.record_server_errors
        } else if status.is_client_error() {
            started || self.client_errors == ClientErrors::Always
        } else {
            true
        }
    }
}

impl IdempotencyLayer {
    /// A layer running every request it makes idempotent as a call of `op`.
    ///
    /// ```
    /// use std::{sync::Arc, time::Duration};
    /// use idem_http::IdempotencyLayer;
    /// use idem_runtime::{Idempotent, MemoryStore};
    ///
    /// let layer = IdempotencyLayer::new(
    ///     Idempotent::new("http.payments")
    ///         .store(Arc::new(MemoryStore::new()))
    ///         .ttl(Duration::from_secs(24 * 3600)),
    /// )
    /// .tenant(|request| {
    ///     let tenant = request.headers.get("x-tenant")?;
    ///     Some(tenant.to_str().ok()?.to_owned())
    /// })
    /// .replay_header(http::header::LOCATION);
    /// ```
    pub fn new(op: Idempotent) -> Self {
        IdempotencyLayer {
            settings: Arc::new(Settings {
                op: op.mode(Mode::ReturnFirst).on_error(OnError::Release),
                header: IDEMPOTENCY_KEY,
                methods: vec![Method::POST, Method::PATCH],
                required: true,
                tenant: None,
                replayable: Vec::new(),
                record_server_errors: false,
                client_errors: ClientErrors::default(),
                body_limit: DEFAULT_BODY_LIMIT,
                retry_after: Duration::from_secs(1),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
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

    /// The tenant of a request (the authenticated user, an account header): keys are
    /// scoped by it, so one tenant never receives another's response. `None`, or no
    /// tenant function, is the anonymous tenant.
    pub fn tenant(self, tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.with(|s| s.tenant = Some(Arc::new(tenant)))
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

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.settings;
        f.debug_struct("IdempotencyLayer")
            .field("op", &s.op)
            .field("header", &s.header)
            .field("methods", &s.methods)
            .field("required", &s.required)
            .field("tenant", &s.tenant.is_some())
            .field("replayable", &s.replayable)
            .field("record_server_errors", &s.record_server_errors)
            .field("client_errors", &s.client_errors)
            .field("body_limit", &s.body_limit)
            .finish()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.settings.clone())
    }
}
