//! A response as the record keeps it, and as a replay gives it back: status, the
//! replayable headers, the body bytes.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::response::Parts;
use http::{Response, StatusCode};
use serde::de::{Error as _, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::grpc::{GRPC_MESSAGE, GRPC_STATUS, GRPC_STATUS_DETAILS};

/// The header a replayed response carries.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A finished response, in the record: one JSON object, its body under the key that
/// says how it is kept — `{"status":201,"headers":[…],"text":"…"}` (or `"base64"`, or
/// `"not_kept"`), and `"trailers"` when there are any.
///
/// Written and read by hand rather than with `#[serde(flatten)]`, which reads an object
/// by buffering every entry first: the same JSON, read without that copy, on every first
/// request (whose answer is read back to check it replays equal) and every replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordedResponse {
    status: u16,
    /// `content-type`, a trailers-only gRPC response's status, and the headers the layer
    /// was told to replay, in order.
    headers: Vec<(String, String)>,
    body: RecordedBody,
    /// Trailers (gRPC's status), in order.
    trailers: Vec<(String, String)>,
}

/// The body: as text when it is UTF-8 (readable in the table), else base64; or why
/// it was not kept (a stream that grew past the limit, or was cut off).
#[derive(Debug, Clone, PartialEq, Eq)]
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

    /// Its key in the record's object, and its value.
    fn entry(&self) -> (&'static str, &str) {
        match self {
            RecordedBody::Text(text) => ("text", text),
            RecordedBody::Base64(encoded) => ("base64", encoded),
            RecordedBody::NotKept(why) => ("not_kept", why),
        }
    }
}

impl Serialize for RecordedResponse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("status", &self.status)?;
        map.serialize_entry("headers", &self.headers)?;
        let (kept, body) = self.body.entry();
        map.serialize_entry(kept, body)?;
        if !self.trailers.is_empty() {
            map.serialize_entry("trailers", &self.trailers)?;
        }
        map.end()
    }
}

/// The keys of a recorded response's object; any other is passed over.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Field {
    Status,
    Headers,
    Text,
    Base64,
    NotKept,
    Trailers,
    #[serde(other)]
    Other,
}

impl<'de> Deserialize<'de> for RecordedResponse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(ResponseVisitor)
    }
}

struct ResponseVisitor;

impl<'de> Visitor<'de> for ResponseVisitor {
    type Value = RecordedResponse;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a recorded response: an object with `status`, `headers` and its body")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RecordedResponse, A::Error> {
        let (mut status, mut headers, mut body, mut trailers) = (None, None, None, None);
        while let Some(field) = map.next_key::<Field>()? {
            let once = |seen: bool, name: &'static str| match seen {
                true => Err(A::Error::duplicate_field(name)),
                false => Ok(()),
            };
            match field {
                Field::Status => {
                    once(status.is_some(), "status")?;
                    status = Some(map.next_value()?);
                }
                Field::Headers => {
                    once(headers.is_some(), "headers")?;
                    headers = Some(map.next_value()?);
                }
                Field::Trailers => {
                    once(trailers.is_some(), "trailers")?;
                    trailers = Some(map.next_value()?);
                }
                Field::Text | Field::Base64 | Field::NotKept => {
                    once(body.is_some(), "the body")?;
                    let value: String = map.next_value()?;
                    body = Some(match field {
                        Field::Text => RecordedBody::Text(value),
                        Field::Base64 => RecordedBody::Base64(value),
                        _ => RecordedBody::NotKept(value),
                    });
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RecordedResponse {
            status: status.ok_or_else(|| A::Error::missing_field("status"))?,
            headers: headers.ok_or_else(|| A::Error::missing_field("headers"))?,
            body: body.ok_or_else(|| A::Error::custom("no body: expected `text`, `base64` or `not_kept`"))?,
            trailers: trailers.unwrap_or_default(),
        })
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

    /// Records written by the derived (flattened) form read back the same, with their
    /// trailers, a body of each kind and a key this version does not know; a record
    /// without a body, or with two, is refused.
    #[test]
    fn records_of_every_shape_read_back() {
        for json in [
            r#"{"status":200,"headers":[],"text":"ok"}"#,
            r#"{"status":200,"headers":[["content-type","text/plain"]],"base64":"AJ8=","trailers":[["grpc-status","0"]]}"#,
            r#"{"status":201,"headers":[],"not_kept":"the stream grew past 1 MiB"}"#,
        ] {
            let read: RecordedResponse = serde_json::from_str(json).unwrap();
            assert_eq!(
                serde_json::to_string(&read).unwrap(),
                json,
                "written back as it was read"
            );
        }
        let later: RecordedResponse =
            serde_json::from_str(r#"{"status":200,"headers":[],"later":{"a":[1]},"text":"ok"}"#).unwrap();
        assert_eq!(later.body, RecordedBody::Text("ok".into()));
        for refused in [
            r#"{"status":200,"headers":[]}"#,
            r#"{"status":200,"headers":[],"text":"a","base64":"AA=="}"#,
            r#"{"headers":[],"text":"a"}"#,
        ] {
            assert!(serde_json::from_str::<RecordedResponse>(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn binary_bodies_round_trip() {
        let body = Bytes::from_static(&[0, 159, 146, 150, 255]);
        let recorded = RecordedResponse::new(&parts(200, &[]), &body, &[]);
        assert_eq!(body_of(recorded.replay(false)), body);
    }
}
