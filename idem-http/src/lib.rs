//! An `Idempotency-Key` layer for [tower] and [axum] over idem's stores, after
//! [draft-ietf-httpapi-idempotency-key-header] and Stripe's documented behaviour.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{routing::post, Router, body::Body, http::{Request, StatusCode}};
//! use idem_http::IdempotencyLayer;
//! use idem_runtime::{Idempotent, MemoryStore};
//! use tower::ServiceExt;
//!
//! /// Who is signed in: what the application's auth middleware puts in each request's
//! /// extensions once it has verified the request's session or token.
//! #[derive(Clone)]
//! struct User(String);
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let layer = IdempotencyLayer::new(Idempotent::new("http.pay").store(Arc::new(MemoryStore::new())))
//!     // Each signed-in user's keys are their own.
//!     .principal(|user: &User| user.0.clone());
//! // On the method router: a method the route does not serve gets axum's own 405.
//! let app = Router::new().route("/payments", post(|| async { (StatusCode::CREATED, "charge 1") }).route_layer(layer));
//!
//! let pay = |user: Option<&str>, cookie: &str| {
//!     let mut request = Request::post("/payments")
//!         .header("cookie", cookie)
//!         .header("idempotency-key", "0f8fad5b-d9cb-469f-a165-70867728950e");
//!     if let Some(user) = user {
//!         // What the auth middleware does (here by hand).
//!         request = request.extension(User(user.to_owned()));
//!     }
//!     request.body(Body::empty()).unwrap()
//! };
//! let first = app.clone().oneshot(pay(Some("alice"), "session=s1; _ga=1")).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! // A double click after an analytics cookie changed: the same user, the first response.
//! let retry = app.clone().oneshot(pay(Some("alice"), "session=s1; _ga=2")).await.unwrap();
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! // Another user with the same key is another request, never alice's response.
//! let other = app.clone().oneshot(pay(Some("bob"), "session=s1; _ga=1")).await.unwrap();
//! assert!(other.headers().get("idempotent-replayed").is_none());
//! // A request nobody signed in for cannot be told apart from anyone's: refused.
//! let anonymous = app.oneshot(pay(None, "session=s1; _ga=1")).await.unwrap();
//! assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
//! # }
//! ```
//!
//! Each caller's keys are its own, and a caller is *who* sends the request, not the
//! bytes of its credentials: a cookie that changes between a click and its retry (an
//! analytics tag, a rotated CSRF or session cookie), or a bearer token refreshed
//! before a retry, must not make the retry another caller — that is a second charge.
//! So a layer is told whose each request is before it can be used (the type says so:
//! [`IdempotencyLayer::new`] is not a `tower::Layer` until then):
//!
//! - [`IdempotencyLayer::principal`]: the principal the application's authentication
//!   put in the request's extensions (a user id, a token's subject) — the way to
//!   choose;
//! - [`IdempotencyLayer::caller`]: a function of the request that names its verified
//!   caller (an account a gateway authenticated and forwards);
//! - [`IdempotencyLayer::session_cookie`]: the value of one session cookie, hashed —
//!   for a session id that does not rotate during a session;
//! - [`IdempotencyLayer::shared`]: a route whose records every caller shares.
//!
//! A request whose caller cannot be named is refused (401), never anonymous;
//! [`IdempotencyLayer::tenant_header`] narrows a caller's scope by a header and never
//! names a caller by itself.
//!
//! What a request meets, in order:
//!
//! | the request | the answer |
//! |---|---|
//! | a method outside [`IdempotencyLayer::methods`] (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE` by default) | passed through untouched |
//! | a method the route does not serve | axum's 405, when the layer is on the method router (`post(handler).route_layer(layer)`) |
//! | no key on a route that needs one | 400 `application/problem+json` naming the header |
//! | a key that is neither a quoted string (`"order-7"`) nor a bare value of printable ASCII without spaces (a UUID, as Stripe's SDKs send), or longer than 255 bytes | 400, saying what to send |
//! | no caller the layer can name (not signed in, no session cookie) | 401 |
//! | a body above [`IdempotencyLayer::body_limit`] | 413, the body not read further |
//! | the first with its key (scoped by method, route and caller) | the handler runs; its response is recorded and returned as it is |
//! | the same key and request again (a JSON body may be serialized again: [`BodyFingerprint`]) | the first response: status, body bytes, `content-type` and the [replayable](IdempotencyLayer::replay_header) headers, with `Idempotent-Replayed: true` |
//! | the same key with another request (method, path, query or body) | 422, naming the body fields that differ (never their values) |
//! | the same key while the first still runs | 409 with `Retry-After`, or, with `wait` on the operation, the first response once it is ready |
//! | a streamed response (no known length), or one above [`IdempotencyLayer::response_limit`] | passed on as it comes (never held whole); recorded if it ended within the limit, else recorded as run and not replayable: duplicates get 409. Its end (trailers, or the end of the body) is passed on once the record is written, so a retry sent the moment the client has it all is answered from the record |
//! | a 4xx the handler answered after [`started`] | recorded and replayed like a 2xx ([`ClientErrors`]) |
//! | a 4xx before that (an extractor's rejection, a validation) | returned, not recorded: a corrected retry runs |
//! | a 5xx | returned, not recorded (the claim is released): a retry runs ([`IdempotencyLayer::record_server_errors`]) |
//! | a request an outer layer (auth, rate limit) refuses | never reaches this layer: no record |
//! | the same key after the operation's `ttl` | a new request; or, on an operation that keeps tombstones ([`AfterExpiry::Gone`](idem_runtime::AfterExpiry::Gone)), 410 `application/problem+json` until the tombstone's window ends |
//! | the same key after its record's data subject was erased ([`idem_runtime::subject`]) | 410 |
//!
//! Problem documents speak to the client about its request; the operation's biz, the
//! scoped record key and the store's errors go to the logs (`tracing`).
//!
//! Inside the handler, [`idem_runtime::context()`] names the call (its `biz`, and the
//! scoped key): an `#[idempotent]` function further down can key on it, and
//! [`IdempotencyKeyExt`] hands a derived key to the services the handler calls.
//!
//! The layer must sit on routes whose handler runs in the request's task (axum's do):
//! the lease heartbeat, the context and [`started`] follow that task.
//!
//! Why the dependencies: `sfv` parses the draft's quoted key as an RFC 8941 structured
//! field; `sha2` hashes session cookies and bodies; `tokio` carries a streamed response's
//! copy back to the record;
//! `http-body-util` buffers bodies under a limit; `base64` keeps a binary response body
//! in the record's text column; `tower-layer`/`tower-service` are the traits the layer
//! implements (not all of tower); `axum` (feature `axum`, on by default) only to read
//! the matched route; `reqwest` (feature `reqwest`) for [`IdempotencyKeyExt`] on its
//! request builder and for `KeyedClient`, whose retries (with backoff and `Retry-After`)
//! are `backon`'s and whose error is a `thiserror` enum; `tonic` (feature `tonic`) for
//! `GrpcRetryLayer`, which retries a tonic client's calls with their key (its body and
//! status types, and its own mapping of transport errors to statuses).
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
//! [draft-ietf-httpapi-idempotency-key-header]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod body_print;
mod caller;
mod grpc;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub mod grpc_retry;
mod key;
#[cfg(feature = "reqwest")]
mod keyed_client;
mod layer;
mod outgoing;
mod problem;
mod recorded;
mod scope;
mod service;
mod settings;
mod started;
#[cfg(any(feature = "reqwest", feature = "tonic"))]
mod tries;

pub use body::IdempotencyBody;
pub use body_print::BodyFingerprint;
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
pub use grpc_retry::{grpc_outcome_is_unknown, GrpcRetry, GrpcRetryLayer};
pub use key::MAX_KEY_BYTES;
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use keyed_client::{KeyedClient, SendError};
pub use layer::{
    CallerNamed, CallerUnnamed, ClientErrors, IdempotencyLayer, NamesItsCallers, DEFAULT_BODY_LIMIT,
    DEFAULT_RESPONSE_LIMIT,
};
pub use outgoing::{
    grpc_status_is_ambiguous, outgoing_key, IdempotencyKeyExt, NoCall, OutgoingKey, OutgoingKeyLayer, IDEMPOTENCY_KEY,
};
pub use problem::Problem;
pub use recorded::REPLAYED_HEADER;
pub use service::{IdempotencyService, ResponseFuture};
pub use started::started;
