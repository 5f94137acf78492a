//! The layer's options, and the decisions made from them alone: which answers are
//! recorded, and how the layer refuses a request (a problem document, or a gRPC status).
//! [`layer`](crate::layer) builds them; [`service`](crate::service) serves with them.

use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderName;
use http::{Method, Response};
use idem_runtime::{Error, Idempotent};

use crate::body_print::BodyFingerprint;
use crate::caller::Callers;
use crate::grpc;
use crate::layer::ClientErrors;
use crate::problem::Problem;
use crate::scope::Scope;

/// The options, shared by every service the layer makes.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) op: Idempotent,
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) required: bool,
    pub(crate) callers: Callers,
    pub(crate) tenant_header: Option<HeaderName>,
    pub(crate) body_fingerprint: BodyFingerprint,
    pub(crate) ignored_fields: Vec<String>,
    pub(crate) response_limit: usize,
    pub(crate) replayable: Vec<HeaderName>,
    pub(crate) record_server_errors: bool,
    pub(crate) client_errors: ClientErrors,
    pub(crate) body_limit: usize,
    pub(crate) retry_after: Duration,
    /// The data subject of a request, when the layer names one.
    pub(crate) subject: Option<SubjectOf>,
}

/// How a request's data subject is named: the application's function of the request.
#[derive(Clone)]
pub(crate) struct SubjectOf(pub(crate) crate::caller::CallerFn);

impl std::fmt::Debug for SubjectOf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SubjectOf(..)")
    }
}

impl Settings {
    /// Whether a gRPC call that ended with `status` is recorded, as [`records`](Self::records)
    /// judges HTTP statuses: `OK` always, the server's failures (`UNAVAILABLE`,
    /// `INTERNAL`, …) only when asked, the others (the call's own answer, like a 4xx)
    /// when the handler [`started`](crate::started) or when every one is.
    pub(crate) fn records_grpc(&self, status: u32, started: bool) -> bool {
        if crate::grpc::is_ok(status) {
            true
        } else if crate::grpc::is_server_failure(status) {
            self.record_server_errors
        } else {
            self.records_client_error(started)
        }
    }

    /// Whether the call's own refusal (a 4xx, a gRPC status answering the request) is
    /// recorded: once the handler [`started`](crate::started), or when every one is.
    fn records_client_error(&self, started: bool) -> bool {
        started || self.client_errors == ClientErrors::Always
    }

    /// Whether a response with `status` is recorded; `started` when the handler said so.
    pub(crate) fn records(&self, status: http::StatusCode, started: bool) -> bool {
        if status.is_server_error() {
            self.record_server_errors
        } else if status.is_client_error() {
            self.records_client_error(started)
        } else {
            true
        }
    }
}

impl Settings {
    pub(crate) fn problem<B: From<Bytes>>(&self, problem: Problem, detail: String) -> Response<B> {
        problem.response(detail, self.retry_after_secs())
    }

    /// The layer's refusal of a request: a problem document, or for a gRPC call a
    /// trailers-only response with the matching `grpc-status`.
    pub(crate) fn refuse<B: From<Bytes>>(&self, grpc: bool, problem: Problem, detail: String) -> Response<B> {
        if grpc {
            grpc::refusal(problem, &detail, self.retry_after_secs())
        } else {
            self.problem(problem, detail)
        }
    }

    fn retry_after_secs(&self) -> u64 {
        self.retry_after.as_secs() + u64::from(self.retry_after.subsec_nanos() > 0)
    }

    /// The answer to a call idem refused or failed; `ran` when the handler ran in it.
    /// The client is told about its request; the error itself (biz, scoped key, the
    /// store's cause) goes to the logs.
    pub(crate) async fn answer<B: From<Bytes>>(
        &self,
        error: Error,
        grpc: bool,
        ran: bool,
        scope: &Scope,
    ) -> Response<B> {
        let problem = match &error {
            Error::InProgress { .. } => Problem::InProgress,
            Error::PayloadMismatch { .. } => Problem::KeyReused,
            Error::InvalidKey { .. } => Problem::KeyMalformed,
            Error::OutcomeUnknown { .. } => Problem::OutcomeUnknown,
            Error::Expired { .. } => Problem::Expired,
            Error::AnswerNotKept { .. } => Problem::NotReplayable,
            Error::Erased { .. } => Problem::Erased,
            _ if ran => Problem::NotRecorded,
            Error::Store { .. } => Problem::StoreUnavailable,
            _ => Problem::Misconfigured,
        };
        if problem.status().is_server_error() {
            tracing::error!(target: "idem", error = %error, "idempotency layer: {}", problem.title());
        } else {
            tracing::debug!(target: "idem", error = %error, "idempotency layer: {}", problem.title());
        }
        let detail = match problem {
            Problem::KeyReused => match self.first_request(scope).await {
                Some(first) => format!(
                    "this Idempotency-Key was first used for another request: {}. Send a new key with a new \
                     request",
                    scope.differences(&first)
                ),
                None => problem.default_detail().to_owned(),
            },
            _ => problem.default_detail().to_owned(),
        };
        self.refuse(grpc, problem, detail)
    }

    /// The request the key in `scope` was first used for, as its record keeps it.
    async fn first_request(&self, scope: &Scope) -> Option<Scope> {
        let store = self.op.given_store().cloned().or_else(idem_runtime::installed)?;
        let record = store.get(self.op.biz(), &scope.record_key()).await.ok()??;
        serde_json::from_str(record.request_body.as_deref()?).ok()
    }
}
