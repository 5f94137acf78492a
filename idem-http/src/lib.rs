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
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let layer = IdempotencyLayer::new(Idempotent::new("http.pay").store(Arc::new(MemoryStore::new())));
//! let app = Router::new()
//!     .route("/payments", post(|| async { (StatusCode::CREATED, "charge 1") }))
//!     .route_layer(layer);
//!
//! let pay = || Request::post("/payments").header("idempotency-key", "\"order-7\"").body(Body::empty()).unwrap();
//! let first = app.clone().oneshot(pay()).await.unwrap();
//! assert_eq!(first.status(), StatusCode::CREATED);
//! let retry = app.oneshot(pay()).await.unwrap();
//! assert_eq!(retry.status(), StatusCode::CREATED);
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # }
//! ```
//!
//! What a request meets, in order:
//!
//! | the request | the answer |
//! |---|---|
//! | a method outside [`IdempotencyLayer::methods`] (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE` by default) | passed through untouched |
//! | no key on a route that needs one | 400 `application/problem+json` naming the header |
//! | a key that is not one sf-string (`"…"`) or token, or longer than 255 bytes | 400 |
//! | a body above [`IdempotencyLayer::body_limit`] | 413, the body not read further |
//! | the first with its key (scoped by method, route and tenant) | the handler runs; its response is recorded and returned as it is |
//! | the same key and request again | the first response: status, body bytes, `content-type` and the [replayable](IdempotencyLayer::replay_header) headers, with `Idempotent-Replayed: true` |
//! | the same key with another body (or method, or route) | 422 |
//! | the same key while the first still runs | 409 with `Retry-After`, or, with `wait` on the operation, the first response once it is ready |
//! | a 4xx the handler answered after [`started`] | recorded and replayed like a 2xx ([`ClientErrors`]) |
//! | a 4xx before that (an extractor's rejection, a validation) | returned, not recorded: a corrected retry runs |
//! | a 5xx | returned, not recorded (the claim is released): a retry runs ([`IdempotencyLayer::record_server_errors`]) |
//! | a request an outer layer (auth, rate limit) refuses | never reaches this layer: no record |
//! | the same key after the operation's `ttl` | a new request |
//!
//! Inside the handler, [`idem_runtime::context()`] names the call (its `biz`, and the
//! scoped key): an `#[idempotent]` function further down can key on it, and
//! [`IdempotencyKeyExt`] hands a derived key to the services the handler calls.
//!
//! The layer must sit on routes whose handler runs in the request's task (axum's do):
//! the lease heartbeat, the context and [`started`] follow that task.
//!
//! Why the dependencies: `sfv` parses the header as an RFC 8941 structured field;
//! `http-body-util` buffers bodies under a limit; `base64` keeps a binary response body
//! in the record's text column; `tower-layer`/`tower-service` are the traits the layer
//! implements (not all of tower); `axum` (feature `axum`, on by default) only to read
//! the matched route; `reqwest` (feature `reqwest`) for [`IdempotencyKeyExt`] on its
//! request builder.
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
//! [draft-ietf-httpapi-idempotency-key-header]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-idempotency-key-header/
#![cfg_attr(docsrs, feature(doc_cfg))]

mod key;
mod layer;
mod outgoing;
mod problem;
mod recorded;
mod scope;
mod service;
mod started;

pub use key::MAX_KEY_BYTES;
pub use layer::{ClientErrors, IdempotencyLayer, DEFAULT_BODY_LIMIT};
pub use outgoing::{outgoing_key, IdempotencyKeyExt, NoCall, IDEMPOTENCY_KEY};
pub use problem::Problem;
pub use recorded::REPLAYED_HEADER;
pub use service::{IdempotencyService, ResponseFuture};
pub use started::started;
