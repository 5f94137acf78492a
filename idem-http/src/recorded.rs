//! A response as the record keeps it, and as a replay gives it back: status, the
//! replayable headers, the body bytes.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::response::Parts;
use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};

/// The header a replayed response carries.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A finished response, in the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RecordedResponse {
    status: u16,
    /// `content-type` and the headers the layer was told to replay, in order.
    headers: Vec<(String, String)>,
    #[serde(flatten)]
    body: RecordedBody,
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
        let headers = std::iter::once(&CONTENT_TYPE)
            .chain(replayable)
            .flat_map(|name| parts.headers.get_all(name).iter().map(move |value| (name, value)))
            .filter_map(|(name, value)| match value.to_str() {
                Ok(text) => Some((name.as_str().to_owned(), text.to_owned())),
                Err(_) => {
                    tracing::warn!(header = %name, "a replayable header's value is not visible ASCII: not recorded");
                    None
                }
            })
            .collect();
        RecordedResponse {
            status: parts.status.as_u16(),
            headers,
            body: RecordedBody::of(body),
        }
    }

    /// The same response with `body`, a stream's whole body kept as it went by.
    pub(crate) fn with_body(mut self, body: &Bytes) -> Self {
        self.body = RecordedBody::of(body);
        self
    }

    /// The same response, its body not kept (`why`): it ran, and duplicates are told
    /// it cannot be replayed.
    pub(crate) fn not_kept(mut self, why: &str) -> Self {
        self.body = RecordedBody::NotKept(why.to_owned());
        self
    }

    /// The response a duplicate gets: the recorded one, marked `Idempotent-Replayed: true`;
    /// or, when its body was not kept, a 409 saying so.
    pub(crate) fn replay<B: From<Bytes>>(self) -> Response<B> {
        let body = match self.body {
            RecordedBody::NotKept(why) => {
                let detail = format!(
                    "{} ({why}); it is not run again",
                    "the first request with this Idempotency-Key was processed, and its response was not kept"
                );
                return crate::problem::Problem::NotReplayable.response(detail, 0);
            }
            RecordedBody::Text(text) => Bytes::from(text),
            RecordedBody::Base64(encoded) => match STANDARD.decode(&encoded) {
                Ok(bytes) => Bytes::from(bytes),
                Err(error) => {
                    tracing::error!(%error, "a recorded response body is not valid base64: replayed empty");
                    Bytes::new()
                }
            },
        };
        let mut response = Response::new(B::from(body));
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
        let replayed: Response<Bytes> = serde_json::from_str::<RecordedResponse>(&json).unwrap().replay();
        assert_eq!(replayed.status(), 201);
        assert_eq!(replayed.headers()["location"], "/p/1");
        assert_eq!(replayed.headers()[REPLAYED_HEADER], "true");
        assert!(
            replayed.headers().get("set-cookie").is_none(),
            "only the replayable headers"
        );
        assert_eq!(replayed.body(), &Bytes::from_static(b"{\"id\":1}"));
    }

    #[test]
    fn binary_bodies_round_trip() {
        let body = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let recorded = RecordedResponse::new(&parts(200, &[]), &body, &[]);
        let replayed: Response<Bytes> = recorded.replay();
        assert_eq!(replayed.body(), &body);
    }
}
