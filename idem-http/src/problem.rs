//! The layer's own answers, as RFC 9457 `application/problem+json` documents.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

/// What the layer answers itself, without (or instead of) the handler's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// 400: the route needs an `Idempotency-Key` and the request has none.
    KeyMissing,
    /// 400: the header is not a key: a quoted string, or a bare value of printable
    /// ASCII without spaces, of at most 255 bytes.
    KeyMalformed,
    /// 401: the route keeps each caller's keys apart, and the request's caller cannot
    /// be named (not signed in, or no session cookie).
    CallerUnknown,
    /// 422: the key was first used with another request body (or method, or route).
    KeyReused,
    /// 409: the first request with this key is still running; `Retry-After` says when
    /// to try again.
    InProgress,
    /// 409: the first request with this key was answered with a response that was not
    /// kept whole (a stream, one larger than the layer records, a stream its client
    /// stopped reading, or a response of an operation that keeps only a digest:
    /// `Idempotent::keep_answer(false)`): it ran once, and its response cannot be given
    /// again. Every
    /// retry with the key gets this until the operation's `ttl` ends the record: ask for
    /// the outcome another way, or send a new key to run the request again.
    NotReplayable,
    /// 409: the first request with this key started an effect whose outcome is
    /// unknown (its process died, or the other side never answered), and its step
    /// fails closed: nothing runs it again until an operator settles it. Every retry
    /// with the key gets this; it is neither a replay nor a new run.
    OutcomeUnknown,
    /// 410: the first request with this key ran long ago, and its response is no
    /// longer kept: the operation keeps a tombstone past its `ttl`
    /// ([`AfterExpiry::Gone`](idem_runtime::AfterExpiry::Gone)). It is not run again.
    Expired,
    /// 410: the first request with this key ran, and what its record kept was erased
    /// with its data subject. It is not run again.
    Erased,
    /// 413: the request body is larger than the layer buffers.
    BodyTooLarge,
    /// 400: the request body could not be read.
    BodyUnreadable,
    /// 503: the idempotency store failed before the handler ran; nothing was executed.
    StoreUnavailable,
    /// 500: the handler ran, and its outcome could not be recorded or its body read.
    NotRecorded,
    /// 500: the operation cannot run (an invalid option, no store installed, …).
    Misconfigured,
}

impl Problem {
    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::KeyMissing | Problem::KeyMalformed | Problem::BodyUnreadable => StatusCode::BAD_REQUEST,
            Problem::CallerUnknown => StatusCode::UNAUTHORIZED,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InProgress | Problem::NotReplayable | Problem::OutcomeUnknown => StatusCode::CONFLICT,
            Problem::Expired | Problem::Erased => StatusCode::GONE,
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::NotRecorded | Problem::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The problem type, a URI a client can match on.
    pub fn type_uri(self) -> &'static str {
        match self {
            Problem::KeyMissing => "urn:idem:problem:idempotency-key-missing",
            Problem::KeyMalformed => "urn:idem:problem:idempotency-key-malformed",
            Problem::CallerUnknown => "urn:idem:problem:caller-unknown",
            Problem::NotReplayable => "urn:idem:problem:response-not-replayable",
            Problem::KeyReused => "urn:idem:problem:idempotency-key-reused",
            Problem::InProgress => "urn:idem:problem:request-in-progress",
            Problem::OutcomeUnknown => "urn:idem:problem:outcome-unknown",
            Problem::Expired => "urn:idem:problem:idempotency-key-expired",
            Problem::Erased => "urn:idem:problem:record-erased",
            Problem::BodyTooLarge => "urn:idem:problem:body-too-large",
            Problem::BodyUnreadable => "urn:idem:problem:body-unreadable",
            Problem::StoreUnavailable => "urn:idem:problem:store-unavailable",
            Problem::NotRecorded => "urn:idem:problem:not-recorded",
            Problem::Misconfigured => "urn:idem:problem:misconfigured",
        }
    }

    /// The short, fixed title.
    pub fn title(self) -> &'static str {
        match self {
            Problem::KeyMissing => "Idempotency-Key is missing",
            Problem::KeyMalformed => "Idempotency-Key is malformed",
            Problem::CallerUnknown => "The caller of this request cannot be told",
            Problem::NotReplayable => "The first response to this Idempotency-Key cannot be replayed",
            Problem::KeyReused => "Idempotency-Key is already used for another request",
            Problem::InProgress => "A request with this Idempotency-Key is being processed",
            Problem::OutcomeUnknown => "The outcome of the request with this Idempotency-Key is unknown",
            Problem::Expired => "The response to this Idempotency-Key has expired",
            Problem::Erased => "The record of this Idempotency-Key was erased",
            Problem::BodyTooLarge => "Request body is too large",
            Problem::BodyUnreadable => "Request body could not be read",
            Problem::StoreUnavailable => "Idempotency store is unavailable",
            Problem::NotRecorded => "The response could not be recorded",
            Problem::Misconfigured => "The idempotent operation is misconfigured",
        }
    }

    /// What the client is told when nothing more specific applies: about its request,
    /// never the layer's internals (which go to the logs).
    pub(crate) fn default_detail(self) -> &'static str {
        match self {
            Problem::KeyMissing => "this request needs an Idempotency-Key header",
            Problem::KeyMalformed => "the Idempotency-Key header is not a key",
            Problem::CallerUnknown => "the request is not signed in as a caller this route can name",
            Problem::KeyReused => {
                "this Idempotency-Key was first used for another request; send a new key with a new request"
            }
            Problem::InProgress => {
                "the first request with this Idempotency-Key is still being processed; retry after Retry-After"
            }
            Problem::NotReplayable => {
                "the first request with this Idempotency-Key was processed, and its response is not kept (it was \
                 streamed, too large, or is kept only as a digest); it is not run again: ask for its outcome \
                 another way, or send a new key to run it again"
            }
            Problem::OutcomeUnknown => {
                "the first request with this Idempotency-Key may have taken effect, and whether it did is \
                 being found out; it is not run again. Do not send it again under a new key: retry this one \
                 later, or ask for its outcome another way"
            }
            Problem::Expired => {
                "the first request with this Idempotency-Key was processed long ago and its response is no \
                 longer kept; it is not run again: ask for its outcome another way, or send a new key to run it \
                 again"
            }
            Problem::Erased => {
                "the first request with this Idempotency-Key was processed, and its record was erased at its \
                 owner's request; it is not run again: send a new key to run it again"
            }
            Problem::BodyTooLarge => "the request body is too large",
            Problem::BodyUnreadable => "the request body could not be read",
            Problem::StoreUnavailable => "the request was not processed; retry later with the same Idempotency-Key",
            Problem::NotRecorded => {
                "the request was processed but its response could not be recorded; retry with the same \
                 Idempotency-Key"
            }
            Problem::Misconfigured => "the request was not processed: the server is misconfigured",
        }
    }

    /// The problem document, with `detail` saying what was wrong in this request.
    pub(crate) fn response<B: From<Bytes>>(self, detail: String, retry_after_secs: u64) -> Response<B> {
        #[derive(Serialize)]
        struct Document<'a> {
            #[serde(rename = "type")]
            type_uri: &'a str,
            title: &'a str,
            status: u16,
            detail: &'a str,
        }
        let document = Document {
            type_uri: self.type_uri(),
            title: self.title(),
            status: self.status().as_u16(),
            detail: &detail,
        };
        let body = serde_json::to_vec(&document).unwrap_or_default();
        let mut response = Response::new(B::from(Bytes::from(body)));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if self == Problem::InProgress {
            headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}
