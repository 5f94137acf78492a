//! The parts idem's examples share, so each example file is its `main` and what it
//! shows: the examples' stand-in for verifying a bearer token, and the gRPC payment
//! service that `grpc_payment` serves (and the layer's gRPC tests call).
//!
//! The examples themselves are this crate's `[[example]]`s; from the repository's root:
//!
//! ```text
//! cargo run --example payment        # the evening of double clicks, on a SQLite file
//! cargo run --example http_payment   # the payment form behind the Idempotency-Key layer
//! cargo run --example grpc_payment   # the same service over gRPC (tonic)
//! cargo run --example outbox         # a charge and its message committed together
//! cargo run --example metrics        # idem's metrics on a Prometheus endpoint
//! cargo run --example pipeline -- …  # orders through HTTP, an outbox and RabbitMQ
//! ```
//!
//! Why each dependency is here: tonic, tonic-prost and prost for the gRPC service
//! (prost's derive writes its messages, so no `protoc` is needed), tower for the
//! authentication layer in front of idem's, tokio and tokio-stream to serve it, http
//! and http-body for its requests' types.

pub mod bearer;
pub mod grpc;
