//! A response as the record keeps it, and as a replay gives it back: status, the
//! replayable headers, the body bytes.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::response::Parts;
use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::grpc::{GRPC_MESSAGE, GRPC_STATUS, GRPC_STATUS_DETAILS};

/// The header a replayed response carries.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A finished response, in the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordedResponse {
    status: u16,
    /// `content-type`, a trailers-only gRPC response's status, and the headers the layer
    /// was told to replay, in order.
    headers: Vec<(String, String)>,
    #[serde(flatten)]
    body: RecordedBody,
    /// Trailers (gRPC's status), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    trailers: Vec<(String, String)>,
}

/// The body: as text when it is UTF-8 (readable in the table), else base64; or why
/// it was not kept (a stream that grew past the limit, or was cut off).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RecordedBody {
    Text(String),
    Base64(String),
    NotKept(String),
}

impl RecordedBody {
    fn of(body: &Bytes) -> Self {
        match std::str::from_utf8(body) {
            Ok(text) => RecordedBody::Text(text.to_owned()),
            Err(_) => RecordedBody::Base64(STANDARD.encode(body)),
        }
    }
}

impl RecordedResponse {
    /// What of `parts` and `body` is kept: the status, `content-type` and `replayable`
    /// headers (values that are not visible ASCII are left out, with a warning), the body.
    pub(crate) fn new(parts: &Parts, body: &Bytes, replayable: &[HeaderName]) -> Self {
        let headers = [&CONTENT_TYPE, &GRPC_STATUS, &GRPC_MESSAGE, &GRPC_STATUS_DETAILS]
            .into_iter()
            .chain(replayable)
            .flat_map(|name| parts.headers.get_all(name).iter().map(move |value| (name, value)))
            .filter_map(|(name, value)| match value.to_str() {
                Ok(text) => Some((name.as_str().to_owned(), text.to_owned())),
                Err(_) => {
                    tracing::warn!(target: "idem", header = %name, "a replayable header's value is not visible ASCII: not recorded");
                    None
                }
            })
            .collect();
        RecordedResponse {
            status: parts.status.as_u16(),
            headers,
            body: RecordedBody::of(body),
            trailers: Vec::new(),
        }
    }

    /// The same response with `body` and its `trailers` (a stream's, kept as it went by).
    pub(crate) fn with_body(mut self, body: &Bytes, trailers: Option<&http::HeaderMap>) -> Self {
        self.body = RecordedBody::of(body);
        self.trailers = trailers
            .into_iter()
            .flatten()
            .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
            .collect();
        self
    }

    /// The same response, its body not kept (`why`): it ran, and duplicates are told
    /// it cannot be replayed.
    pub(crate) fn not_kept(mut self, why: &str) -> Self {
        self.body = RecordedBody::NotKept(why.to_owned());
        self
    }

    /// The response a duplicate gets: the recorded one, marked `Idempotent-Replayed: true`;
    /// or, when its body was not kept, a refusal saying so (409, or gRPC's
    /// `FAILED_PRECONDITION` when `grpc`).
    pub(crate) fn replay<B>(self, grpc: bool) -> Response<crate::body::IdempotencyBody<B>> {
        let body = match self.body {
            RecordedBody::NotKept(why) => {
                let detail = format!(
                    "{} ({why}); it is not run again: ask for its outcome another way, or send a new key to run it again",
                    "the first request with this Idempotency-Key was processed, and its response was not kept"
                );
                let problem = crate::problem::Problem::NotReplayable;
                return if grpc {
                    crate::grpc::refusal(problem, &detail, 0)
                } else {
                    problem.response(detail, 0)
                };
            }
            RecordedBody::Text(text) => Bytes::from(text),
            RecordedBody::Base64(encoded) => match STANDARD.decode(&encoded) {
                Ok(bytes) => Bytes::from(bytes),
                Err(error) => {
                    tracing::error!(target: "idem", %error, "a recorded response body is not valid base64: replayed empty");
                    Bytes::new()
                }
            },
        };
        let trailers = (!self.trailers.is_empty()).then(|| {
            self.trailers
                .iter()
                .filter_map(|(name, value)| {
                    Some((HeaderName::try_from(name).ok()?, HeaderValue::try_from(value).ok()?))
                })
                .collect::<http::HeaderMap>()
        });
        let mut response = Response::new(crate::body::IdempotencyBody::full_with_trailers(body, trailers));
        *response.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                headers.append(name, value);
            }
        }
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(status: u16, headers: &[(&str, &str)]) -> Parts {
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap().into_parts().0
    }

    #[test]
    fn a_replay_is_the_recorded_response_marked() {
        let location = HeaderName::from_static("location");
        let first = parts(
            201,
            &[
                ("content-type", "application/json"),
                ("location", "/p/1"),
                ("set-cookie", "s=1"),
            ],
        );
        let recorded = RecordedResponse::new(&first, &Bytes::from_static(b"{\"id\":1}"), &[location]);
        let json = serde_json::to_string(&recorded).unwrap();
        assert_eq!(
            json,
            r#"{"status":201,"headers":[["content-type","application/json"],["location","/p/1"]],"text":"{\"id\":1}"}"#
        );
        let replayed = serde_json::from_str::<RecordedResponse>(&json).unwrap().replay(false);
        assert_eq!(replayed.status(), 201);
        assert_eq!(replayed.headers()["location"], "/p/1");
        assert_eq!(replayed.headers()[REPLAYED_HEADER], "true");
        assert!(
            replayed.headers().get("set-cookie").is_none(),
            "only the replayable headers"
        );
        assert_eq!(body_of(replayed), Bytes::from_static(b"{\"id\":1}"));
    }

    /// A replayed body, read whole.
    fn body_of(response: Response<crate::body::IdempotencyBody<http_body_util::Empty<Bytes>>>) -> Bytes {
        use http_body_util::BodyExt;
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(response.into_body().collect()).unwrap().to_bytes()
    }

    #[test]
    fn binary_bodies_round_trip() {
        let body = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let recorded = RecordedResponse::new(&parts(200, &[]), &body, &[]);
        assert_eq!(body_of(recorded.replay(false)), body);
    }
}
