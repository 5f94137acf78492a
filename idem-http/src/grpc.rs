//! gRPC through the same layer: a tonic service is a tower service over HTTP/2, its
//! key is the `idempotency-key` metadata entry (a header), and its answer is the
//! status in the response's trailers. The layer records the trailers with the body,
//! replays both, judges a call by its `grpc-status` rather than its HTTP status, and
//! answers its own refusals as gRPC clients expect: a trailers-only response whose
//! `grpc-status` says what happened.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{HeaderMap, Response};

use crate::problem::Problem;

/// A gRPC call's status (in the trailers, or in the headers of a trailers-only
/// response): always kept in the record.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The status's message.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// The status's details.
pub(crate) const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// gRPC status codes the layer answers with or judges by.
mod code {
    pub const OK: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const FAILED_PRECONDITION: u32 = 9;
    pub const ABORTED: u32 = 10;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;
}

/// Whether a request is a gRPC call (`content-type: application/grpc…`).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/grpc"))
}

/// The gRPC status a refusal of the layer is given, the way gRPC clients act on it: a
/// request to correct is `INVALID_ARGUMENT`; a caller the layer cannot tell,
/// `UNAUTHENTICATED`; a duplicate of a call still running, `ABORTED` (retry later); a key
/// reused for another request, a first answer that cannot be replayed, an outcome
/// that is unknown or a record that is a tombstone, `FAILED_PRECONDITION`; a request too large, `RESOURCE_EXHAUSTED`; the store down,
/// `UNAVAILABLE` (retry with the same key); anything else, `INTERNAL`.
pub(crate) fn status_of(problem: Problem) -> u32 {
    match problem {
        Problem::KeyMissing | Problem::KeyMalformed | Problem::BodyUnreadable => code::INVALID_ARGUMENT,
        Problem::CallerUnknown => code::UNAUTHENTICATED,
        Problem::InProgress => code::ABORTED,
        Problem::KeyReused | Problem::NotReplayable | Problem::OutcomeUnknown | Problem::Expired | Problem::Erased => {
            code::FAILED_PRECONDITION
        }
        Problem::BodyTooLarge => code::RESOURCE_EXHAUSTED,
        Problem::StoreUnavailable => code::UNAVAILABLE,
        Problem::NotRecorded | Problem::Misconfigured => code::INTERNAL,
    }
}

/// A trailers-only gRPC response: HTTP 200, `grpc-status` and `grpc-message` in the
/// headers, no body.
pub(crate) fn refusal<B: From<Bytes>>(problem: Problem, detail: &str, retry_after_secs: u64) -> Response<B> {
    let mut response = Response::new(B::from(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(status_of(problem)));
    if let Ok(message) = HeaderValue::from_str(&percent_encoded(&format!("{}: {detail}", problem.title()))) {
        headers.insert(GRPC_MESSAGE, message);
    }
    if problem == Problem::InProgress {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    }
    response
}

/// The `grpc-status` a response ended with: in its trailers, or in its headers for a
/// trailers-only response.
pub(crate) fn status_in(headers: &HeaderMap) -> Option<u32> {
    headers.get(GRPC_STATUS)?.to_str().ok()?.parse().ok()
}

/// Whether the status a call ended with is the server's failure (retry it) rather than
/// an answer to this request (replay it).
pub(crate) fn is_server_failure(status: u32) -> bool {
    // CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
    // UNAVAILABLE, DATA_LOSS.
    matches!(status, 1 | 2 | 4 | 8 | 10 | 13 | 14 | 15)
}

/// Whether `status` is `OK`.
pub(crate) fn is_ok(status: u32) -> bool {
    status == code::OK
}

/// `grpc-message` is percent-encoded: printable ASCII but `%` as it is.
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_trailers_only_responses_with_a_status() {
        let response: Response<Bytes> = refusal(Problem::InProgress, "retry later", 1);
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["grpc-status"], "10");
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert!(response.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains("retry later"));
        assert_eq!(percent_encoded("größe 100%"), "gr%C3%B6%C3%9Fe 100%25");
        assert!(is_server_failure(14) && !is_server_failure(3) && is_ok(0));
    }
}
